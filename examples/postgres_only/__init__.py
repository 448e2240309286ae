"""A stack with no Redis: RabbitMQ as the broker, the locks and the data in PostgreSQL."""
