"""Lock names from call arguments: bind to the signature, encode canonically, hash.

``f(1, b=2)``, ``f(1, 2)`` and ``f(a=1)`` (``b`` defaulting to 2) name the same lock. Only
types with a stable, explicit encoding are accepted; anything else is an error that names the
task, the argument and its type. Nothing ever falls back to ``repr()`` or ``str()``, which
would silently give different keys for equal values (or equal keys for different ones).
"""

from __future__ import annotations

import datetime as dt
import enum
import hashlib
import importlib
import inspect
import sys
import uuid
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Callable, Optional, Sequence

from celery_singleton_lock.errors import (
    LockConfigurationError,
    LockKeyError,
    UnsupportedArgumentError,
)

__all__ = ["ArgumentKeyer", "canonical_digest"]

KeyCallable = Callable[..., Any]

_SUPPORTED = (
    "str, int, float, bool, None, list/tuple, dict, Decimal, UUID, date/datetime/time, Enum, "
    "bytes, pydantic models"
)


#: a set's items have no order to hash in; pickle carries sets, so they reach a worker
_SET_HINT = "; for a set, send sorted(...) (a list) instead"


def _pydantic_model(value: Any) -> bool:
    """True if ``value`` is a pydantic (v2) model, without importing pydantic.

    A process that never imported pydantic holds no model: the check is a dict look-up.
    """
    pydantic = sys.modules.get("pydantic")
    base = getattr(pydantic, "BaseModel", None) if pydantic is not None else None
    return base is not None and isinstance(value, base)


def _model_data(model: Any) -> Any:
    """A model as a worker receives it: Celery (5.5 and later) sends a ``pydantic=True`` task's
    models as ``model_dump(mode="json")``, so the caller's model and the worker's dict (or the
    model itself, under pickle) give one encoding."""
    try:
        return model.model_dump(mode="json")
    except (ValueError, TypeError):  # pydantic's serialization errors are ValueErrors
        raise _NoEncoding(model) from None


# SHA-256 from CPython's own small C module when it has one (``_sha256`` up to 3.11, ``_sha2``
# from 3.12), else hashlib's (OpenSSL): the same digest. For these short inputs OpenSSL's
# generic digest set-up touches far more code, which a worker's task pays cold: measured in
# ``python -m bench fastpath``, LockedTask ran ~0.7% nearer the floor with the builtin one.
def _small_sha256() -> Callable[[bytes], Any]:
    for module in ("_sha256", "_sha2"):
        try:
            return importlib.import_module(module).sha256  # type: ignore[no-any-return]
        except (ImportError, AttributeError):
            continue
    return hashlib.sha256  # pragma: no cover - a build without CPython's own hashes


_sha256 = _small_sha256()


class _NoEncoding(Exception):
    """A value without a stable encoding, on its way up to ``canonical_digest``.

    Each container it leaves adds its step (dict key, list index, ...) to ``steps``: paths
    are only built for a call that fails, never for the ones that succeed.
    """

    def __init__(self, value: Any) -> None:
        super().__init__()
        self.value = value
        self.steps: list[tuple[str, Any]] = []  # innermost first

    def within(self, kind: str, step: Any) -> _NoEncoding:
        self.steps.append((kind, step))
        return self

    def path(self) -> str:
        """``payload['rows'][1].value``, as a reader would write it; the top-level key bare."""
        text = ""
        for kind, step in reversed(self.steps):
            if kind == "item":
                text = f"{text}[{step!r}]" if text else str(step)
            elif kind == "index":
                text = f"{text}[{step}]"
            elif kind == "key":
                text = f"{text} key {step!r}"
            else:
                text = f"{text}.value"
        return text[:200]


def _path_steps(path: str) -> tuple[str, ...]:
    """``"order.customer_id"`` as its steps; a step left empty (``"order."``) stays ``""``,
    which no parameter, attribute or key of a model's dump is named."""
    return tuple(path.split(".")) if isinstance(path, str) else (path,)


def _step_into(value: Any, step: str) -> Any:
    """One step of a ``lock_on`` path: a key of a mapping, else an attribute.

    A model is read through its JSON dump, as the worker receives it (a dict, see
    ``_model_data``): an attribute read from the caller's model (a ``UUID``, a ``datetime``)
    would encode otherwise than the string the worker's dict holds.
    """
    if _pydantic_model(value):
        try:
            value = value.model_dump(mode="json", include={step})
        except (ValueError, TypeError):
            raise _NoEncoding(value) from None
    if isinstance(value, Mapping):
        return value[step]
    return getattr(value, step)


def _length_prefixed(tag: bytes, payload: bytes) -> bytes:
    return b"%b%d:%b" % (tag, len(payload), payload)


_DECIMAL_SPECIALS = {"n": "NaN", "N": "sNaN"}


def _decimal_text(value: Decimal) -> str:
    """Exact text of ``value``, trailing zeros dropped (``1.0`` and ``1.00`` give ``1E0``).

    Independent of the decimal context: ``normalize()`` rounds to the context's precision
    (so ``1`` and ``1.0000000000000000000000000000001`` collided), under- or overflows at
    its exponent limits, raises on sNaN, and ``str()`` follows its ``capitals`` setting.
    """
    sign, digits, exponent = value.as_tuple()
    prefix = "-" if sign else ""
    if exponent == "F":
        return f"{prefix}Infinity"
    if not isinstance(exponent, int):  # NaN ('n') or sNaN ('N'), with its payload digits
        return prefix + _DECIMAL_SPECIALS[exponent] + "".join(map(str, digits))
    coefficient = "".join(map(str, digits)).lstrip("0")
    significant = coefficient.rstrip("0")
    if not significant:
        return f"{prefix}0"
    return f"{prefix}{significant}E{exponent + len(coefficient) - len(significant)}"


def _encode(value: Any, out: list[bytes]) -> None:
    """Append the canonical encoding of ``value`` to ``out``.

    Every encoding starts with a type tag and is either length- or count-prefixed or ends
    with a ``;`` its text cannot contain. So no encoding is a prefix of another, and a
    sequence of encodings (a list's items, a task name and its arguments) is read back in
    one way only: no two different values share bytes.

    Raises:
        _NoEncoding: ``value``, or a value inside it, has no stable encoding.
    """
    # Exact types first: a call's usual values leave after an identity check or two, before
    # the isinstance chain (Enum's and Mapping's checks are the slow ones). Exact only: a
    # subclass (bool, IntEnum, a str Enum, ...) goes down the chain to its own encoding.
    cls = type(value)
    if cls is str:
        data = value.encode("utf-8", "surrogatepass")
        out.append(b"s%d:%b" % (len(data), data))
    elif cls is int:
        out.append(b"i%x;" % value)
    elif value is None:
        out.append(b"N")
    elif value is True:
        out.append(b"T")
    elif value is False:
        out.append(b"F")
    elif cls is float:
        out.append(b"f%b;" % float.__repr__(value).encode())
    elif cls is list or cls is tuple:
        _encode_sequence(value, out)
    elif cls is dict:
        _encode_mapping(value, out)
    # The checks run in order, so subclasses go first: IntEnum is an int, a str Enum is a
    # str, datetime is a date.
    elif isinstance(value, enum.Enum):
        out.append(_length_prefixed(b"e", f"{cls.__module__}.{cls.__qualname__}".encode()))
        try:
            _encode(value.value, out)
        except _NoEncoding as exc:
            raise exc.within("value", None) from None
    elif isinstance(value, int):
        # hex, and by value: str() of an int over 4300 digits raises ValueError
        # (sys.int_max_str_digits), and a subclass's __int__/__str__ could lie.
        out.append(b"i%x;" % value)
    elif isinstance(value, float):
        # the shortest text that reads back as the same float (-0.0, inf and nan included)
        out.append(b"f%b;" % float.__repr__(value).encode())
    elif isinstance(value, str):
        out.append(_length_prefixed(b"s", value.encode("utf-8", "surrogatepass")))
    elif isinstance(value, (bytes, bytearray, memoryview)):
        out.append(_length_prefixed(b"b", bytes(value)))
    elif isinstance(value, (list, tuple)):
        _encode_sequence(value, out)
    elif isinstance(value, Mapping):
        _encode_mapping(value, out)
    elif isinstance(value, Decimal):
        out.append(_length_prefixed(b"D", _decimal_text(value).encode()))
    elif isinstance(value, uuid.UUID):
        out.append(_length_prefixed(b"u", value.hex.encode()))
    elif isinstance(value, dt.datetime):
        if value.utcoffset() is None:
            out.append(_length_prefixed(b"tn", value.isoformat().encode()))
        else:  # equal instants in different zones are equal datetimes: key them equally
            utc = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
            out.append(_length_prefixed(b"tz", utc.isoformat().encode()))
    elif isinstance(value, dt.date):
        out.append(_length_prefixed(b"dd", value.isoformat().encode()))
    elif isinstance(value, dt.time):
        out.append(_length_prefixed(b"tt", value.isoformat().encode()))
    elif _pydantic_model(value):
        _encode(_model_data(value), out)
    else:
        raise _NoEncoding(value)


def _encode_sequence(value: Sequence[Any], out: list[bytes]) -> None:
    out.append(b"l%d:" % len(value))
    for index, item in enumerate(value):
        try:
            _encode(item, out)
        except _NoEncoding as exc:
            raise exc.within("index", index) from None


def _encode_mapping(value: Mapping[Any, Any], out: list[bytes]) -> None:
    """A mapping as its count, then its (key, value) encodings in sorted order.

    Sorting the encodings makes insertion order irrelevant. Each pair is sorted as the
    bytes of its key then its value: keys never tie with one another (no encoding is a
    prefix of another), except distinct keys that encode alike (two NaNs), which the
    value then orders.
    """
    pairs = []
    for key, item in value.items():
        pair: list[bytes] = []
        try:
            _encode(key, pair)
        except _NoEncoding as exc:
            raise exc.within("key", key) from None
        try:
            _encode(item, pair)
        except _NoEncoding as exc:
            raise exc.within("item", key) from None
        pairs.append(b"".join(pair))
    pairs.sort()
    out.append(b"d%d:" % len(pairs))
    out.extend(pairs)


def _head_value(task_name: str, group: Optional[str]) -> Any:
    """What a lock name's hash starts with: the task's name, or for a ``lock_group`` the pair
    ``["lock_group", group]``. A list's encoding never equals a string's, so a group's locks
    never share a hash with a task that happens to bear the group's name."""
    return task_name if group is None else ["lock_group", group]


def canonical_digest(
    task_name: str, arguments: Mapping[str, Any], *, label: str = "", group: Optional[str] = None
) -> str:
    """SHA-256 (hex) of ``task_name`` (or ``group``, see :func:`_head_value`) and
    ``arguments`` encoded canonically, as one buffer.

    Raises:
        UnsupportedArgumentError: an argument's type has no stable encoding; the message
            names ``label`` (the task), the argument path and its type.
    """
    out: list[bytes] = []
    try:
        _encode(_head_value(task_name, group), out)
        _encode_mapping(arguments, out)
    except _NoEncoding as exc:
        cls = type(exc.value)
        raise UnsupportedArgumentError(
            f"task {label or task_name}: argument {exc.path()} has type "
            f"{cls.__module__}.{cls.__qualname__}, which has no stable lock-key encoding "
            f"(supported: {_SUPPORTED}). Name the arguments that identify the work with "
            "lock_on=(...), or give lock_key=callable returning a string"
            f"{_SET_HINT if isinstance(exc.value, (set, frozenset)) else ''}"
        ) from None
    # One hash over one buffer: cheaper for these short inputs than feeding a hash object
    # part by part, or copying one seeded with the task name (measured).
    digest: str = _sha256(b"".join(out)).hexdigest()
    return digest


class ArgumentKeyer:
    """Computes the lock name of one task's calls; validated once, at task registration.

    Args:
        task_name: goes into the lock name (readable) and into the hash, unless ``group``.
        func: the task function; its signature normalises calls.
        lock_on: names of the parameters that identify the work; None means all of them,
            an empty sequence none (one lock for every call).
        lock_key: callable taking the task's arguments and returning a string, for full
            control; exclusive with ``lock_on``.
        skip_first: the function's first parameter is ``self`` (a bound task).
        namespace: put in front of every name (``compat.Singleton``'s ``singleton_key_prefix``);
            a name never contains braces or whitespace, so neither may this.
        group: the task's ``lock_group``: the name is made from it instead of ``task_name``,
            so the calls of every task of the group with equal identifying arguments (by
            parameter name) share one lock.

    Raises:
        LockConfigurationError: ``lock_on`` names a parameter ``func`` does not have, both
            ``lock_on`` and ``lock_key`` are given, or ``lock_key`` is not callable.
    """

    def __init__(
        self,
        task_name: str,
        func: Callable[..., Any],
        *,
        lock_on: Optional[Sequence[str]] = None,
        lock_key: Optional[KeyCallable] = None,
        skip_first: bool = False,
        namespace: str = "",
        group: Optional[str] = None,
    ) -> None:
        self.task_name = task_name
        self.group = group
        #: the readable start of every name, before its digest: the group, else the task
        self.head = task_name if group is None else group
        self.namespace = namespace
        self.lock_key = lock_key
        signature = inspect.signature(func)
        parameters = list(signature.parameters.values())
        if skip_first and parameters:
            parameters = parameters[1:]
        self.signature = signature.replace(parameters=parameters)
        if lock_on is not None and lock_key is not None:
            raise LockConfigurationError(f"task {task_name}: give lock_on or lock_key, not both")
        if lock_key is not None and not callable(lock_key):
            raise LockConfigurationError(
                f"task {task_name}: lock_key must be a callable returning a string, "
                f"got {type(lock_key).__name__}"
            )
        if isinstance(lock_on, str):
            lock_on = (lock_on,)
        if lock_on is not None:
            lock_on = tuple(lock_on)
            known = self.signature.parameters
            missing = [name for name in lock_on if _path_steps(name)[0] not in known]
            if missing:
                raise LockConfigurationError(
                    f"task {task_name}: lock_on names {missing}, but the task's parameters "
                    f"are {list(known)}; name existing parameters, or a path that starts with "
                    "one ('order.customer_id': an attribute or key of order), or lock_on=() "
                    "for one lock whatever the arguments"
                )
        self.lock_on: Optional[tuple[str, ...]] = lock_on
        # Most task functions take plain parameters: their calls bind without inspect's
        # general (and slower) Signature.bind; anything unusual still goes through it.
        self._plain_names: Optional[tuple[str, ...]] = None
        self._defaults: dict[str, Any] = {}
        #: a call of only positional arguments, from the first to the second count, takes
        #: its values from them and the defaults' tail without binding ((1, 0): never)
        self._positional = (1, 0)
        self._tail: tuple[Any, ...] = ()
        if all(p.kind is p.POSITIONAL_OR_KEYWORD for p in self.signature.parameters.values()):
            self._plain_names = tuple(self.signature.parameters)
            self._names_set = frozenset(self._plain_names)
            self._defaults = {
                p.name: p.default
                for p in self.signature.parameters.values()
                if p.default is not p.empty
            }
            self._tail = tuple(self._defaults.values())  # plain defaults are the last ones
            self._positional = (len(self._plain_names) - len(self._tail), len(self._plain_names))
        self._head, self._pairs = self._constant_parts()

    def _constant_parts(
        self,
    ) -> tuple[bytes, tuple[tuple[bytes, str, int, tuple[str, ...]], ...]]:
        """What every call's hashed bytes share, worked out once instead of per call.

        The bytes are the task name's encoding, then the identity mapping's: its count, then
        its (name, value) pairs sorted by their bytes. The names are fixed (every parameter,
        bound with defaults applied, or the ``lock_on`` ones), and a pair's bytes start with
        its name's encoding, which no other name's is a prefix of: so the names' encodings
        alone decide the order, the same for every call. Returns the bytes before the first
        pair, and each pair's name encoded, its parameter and that one's position in the
        signature, and the rest of its ``lock_on`` path (``("customer_id",)`` for
        ``"order.customer_id"``, ``()`` for a parameter), in that order. Only the values are
        left to encode per call.
        """
        head: list[bytes] = []
        _encode(_head_value(self.task_name, self.group), head)
        if self.lock_key is not None:  # {"lock_key": <the string returned>}
            head.append(b"d1:")
            _encode("lock_key", head)
            return b"".join(head), ()
        # lock_on=(): no names, the same bytes (and lock) for every call
        names = tuple(
            dict.fromkeys(self.signature.parameters if self.lock_on is None else self.lock_on)
        )
        head.append(b"d%d:" % len(names))
        positions = {name: index for index, name in enumerate(self.signature.parameters)}
        pairs = []
        for name in names:
            encoded: list[bytes] = []
            _encode(name, encoded)  # a path's whole text: "order.id" keys apart from "order"
            parameter, *rest = _path_steps(name)
            pairs.append((b"".join(encoded), parameter, positions[parameter], tuple(rest)))
        return b"".join(head), tuple(sorted(pairs))

    def bind(
        self, args: Optional[Sequence[Any]], kwargs: Optional[Mapping[str, Any]]
    ) -> dict[str, Any]:
        """The call's arguments by parameter name, defaults applied."""
        names = self._plain_names
        if names is not None and (args is None or len(args) <= len(names)):
            arguments = dict(zip(names, args or ()))
            fits = True
            if kwargs:  # each keyword a parameter not already given (set checks in C)
                keys = kwargs.keys()
                fits = keys <= self._names_set and arguments.keys().isdisjoint(keys)
                arguments.update(kwargs)
            if fits and len(arguments) < len(names):
                for name in names:
                    if name not in arguments:
                        if name not in self._defaults:
                            fits = False
                            break
                        arguments[name] = self._defaults[name]
            if fits:
                return arguments
        try:
            bound = self.signature.bind(*(args or ()), **(kwargs or {}))
        except TypeError as exc:
            raise LockKeyError(
                f"task {self.task_name}: arguments do not match its signature "
                f"{self.signature}: {exc}"
            ) from None
        bound.apply_defaults()
        return dict(bound.arguments)

    def name(self, args: Optional[Sequence[Any]], kwargs: Optional[Mapping[str, Any]]) -> str:
        """The lock name for a call: ``<namespace><task name or group>:<sha256 of the
        identifying arguments>``.

        Raises:
            LockKeyError: the arguments do not fit the signature, an argument type has no
                stable encoding, or ``lock_key`` raised or returned a non-string.
        """
        out = [self._head]
        if self.lock_key is not None:
            _encode(self._call_key_callable(args, kwargs), out)  # a str: it cannot fail
        else:
            count = len(args) if args else 0
            least, most = self._positional
            try:
                if least <= count <= most and not kwargs:
                    values = args or ()  # all given: read in place (~1,200 instructions less)
                    if count < most:
                        values = (*values, *self._tail[count - least :])
                    for encoded, head, position, steps in self._pairs:
                        out.append(encoded)
                        value = values[position]
                        if steps:
                            value = self._follow(value, head, steps)
                        if type(value) is int:  # _encode's first cases, without its call
                            out.append(b"i%x;" % value)
                        elif type(value) is str:
                            data = value.encode("utf-8", "surrogatepass")
                            out.append(b"s%d:%b" % (len(data), data))
                        else:
                            _encode(value, out)
                else:
                    arguments = self.bind(args, kwargs)
                    for encoded, head, _, steps in self._pairs:
                        out.append(encoded)
                        value = arguments[head]
                        _encode(self._follow(value, head, steps) if steps else value, out)
            except _NoEncoding:
                # The general path raises the error: it names the first argument without an
                # encoding in the order the call gave them, as it always has (not the first in
                # the sorted pairs).
                return self._general_name(args, kwargs)
        # One hash over one buffer: cheaper for these short inputs than feeding a hash object
        # part by part; copying one seeded with the head gained nothing measurable (and a hash
        # object would make the keyer unpicklable).
        digest = _sha256(b"".join(out)).hexdigest()
        return f"{self.namespace}{self.head}:{digest}"

    def _general_name(
        self, args: Optional[Sequence[Any]], kwargs: Optional[Mapping[str, Any]]
    ) -> str:
        """``name`` as bind-then-``canonical_digest``: the reference, and the error path."""
        arguments = self.bind(args, kwargs)
        if self.lock_on is not None:
            arguments = {
                name: self._follow(arguments[head], head, rest)
                for name in self.lock_on
                for head, *rest in (_path_steps(name),)
            }
        digest = canonical_digest(self.task_name, arguments, group=self.group)
        return f"{self.namespace}{self.head}:{digest}"

    def _follow(self, value: Any, head: str, steps: Sequence[str]) -> Any:
        """The value at the end of the ``lock_on`` path ``head.steps`` from ``head``'s value.

        Raises:
            LockKeyError: a step names no key or attribute of the value it is taken from.
            UnsupportedArgumentError: a model on the way could not be dumped.
        """
        for step in steps:
            try:
                value = _step_into(value, step)
            except (KeyError, AttributeError, TypeError):
                raise LockKeyError(
                    f"task {self.task_name}: lock_on path {'.'.join((head, *steps))!r} reached "
                    f"a {type(value).__qualname__} with no key or attribute {step!r}; pass "
                    "arguments that have it, or name another path in lock_on"
                ) from None
            except _NoEncoding:
                raise UnsupportedArgumentError(
                    f"task {self.task_name}: lock_on path {'.'.join((head, *steps))!r} reached "
                    f"a {type(value).__qualname__} whose model_dump(mode='json') failed"
                ) from None
        return value

    def _call_key_callable(
        self, args: Optional[Sequence[Any]], kwargs: Optional[Mapping[str, Any]]
    ) -> str:
        assert self.lock_key is not None
        try:
            value = self.lock_key(*(args or ()), **(kwargs or {}))
        except Exception as exc:
            raise LockKeyError(
                f"task {self.task_name}: lock_key callable raised "
                f"{type(exc).__name__}: {exc}; it must accept the task's arguments"
            ) from exc
        if not isinstance(value, str):
            raise LockKeyError(
                f"task {self.task_name}: lock_key callable returned "
                f"{type(value).__name__}, not a string"
            )
        return value
