"""What a duplicate does: the policies (skip, retry, wait, fail, join, queue), the queue
policy's parking, and deduplication at enqueue."""
