"""Lock names never change: every call hashes the bytes the first release hashed.

Workers of two versions run side by side during a rolling upgrade and must name each call's
lock alike, so ``arguments.py`` may get faster but never different. Two guards: a copy of the
implementation the names were first computed with (``reference_*`` below, kept here only), which
the package must agree with for any values, signatures and options, errors included; and a table
of literal names that implementation computed, so that changing both together still fails.
"""

from __future__ import annotations

import collections
import datetime as dt
import enum
import hashlib
import types
import uuid
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_singleton_lock.arguments import ArgumentKeyer, canonical_digest
from celery_singleton_lock.errors import LockKeyError, UnsupportedArgumentError

# --- the reference: the first release's encoding, as it was -------------------------------

_SUPPORTED = (
    "str, int, float, bool, None, list/tuple, dict, Decimal, UUID, date/datetime/time, Enum, bytes"
)


class _NoEncoding(Exception):
    def __init__(self, value: Any) -> None:
        super().__init__()
        self.value = value
        self.steps: list[tuple[str, Any]] = []

    def within(self, kind: str, step: Any) -> _NoEncoding:
        self.steps.append((kind, step))
        return self

    def path(self) -> str:
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


def _length_prefixed(tag: bytes, payload: bytes) -> bytes:
    return b"%b%d:%b" % (tag, len(payload), payload)


def _decimal_text(value: Decimal) -> str:
    sign, digits, exponent = value.as_tuple()
    prefix = "-" if sign else ""
    if exponent == "F":
        return f"{prefix}Infinity"
    if not isinstance(exponent, int):
        return prefix + {"n": "NaN", "N": "sNaN"}[exponent] + "".join(map(str, digits))
    coefficient = "".join(map(str, digits)).lstrip("0")
    significant = coefficient.rstrip("0")
    if not significant:
        return f"{prefix}0"
    return f"{prefix}{significant}E{exponent + len(coefficient) - len(significant)}"


def _encode(value: Any, out: list[bytes]) -> None:
    if value is None:
        out.append(b"N")
    elif value is True:
        out.append(b"T")
    elif value is False:
        out.append(b"F")
    elif isinstance(value, enum.Enum):
        cls = type(value)
        out.append(_length_prefixed(b"e", f"{cls.__module__}.{cls.__qualname__}".encode()))
        try:
            _encode(value.value, out)
        except _NoEncoding as exc:
            raise exc.within("value", None) from None
    elif isinstance(value, int):
        out.append(b"i%x;" % value)
    elif isinstance(value, float):
        out.append(b"f%b;" % float.__repr__(value).encode())
    elif isinstance(value, str):
        out.append(_length_prefixed(b"s", value.encode("utf-8", "surrogatepass")))
    elif isinstance(value, (bytes, bytearray, memoryview)):
        out.append(_length_prefixed(b"b", bytes(value)))
    elif isinstance(value, (list, tuple)):
        out.append(b"l%d:" % len(value))
        for index, item in enumerate(value):
            try:
                _encode(item, out)
            except _NoEncoding as exc:
                raise exc.within("index", index) from None
    elif isinstance(value, Mapping):
        _encode_mapping(value, out)
    elif isinstance(value, Decimal):
        out.append(_length_prefixed(b"D", _decimal_text(value).encode()))
    elif isinstance(value, uuid.UUID):
        out.append(_length_prefixed(b"u", value.hex.encode()))
    elif isinstance(value, dt.datetime):
        if value.utcoffset() is None:
            out.append(_length_prefixed(b"tn", value.isoformat().encode()))
        else:
            utc = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
            out.append(_length_prefixed(b"tz", utc.isoformat().encode()))
    elif isinstance(value, dt.date):
        out.append(_length_prefixed(b"dd", value.isoformat().encode()))
    elif isinstance(value, dt.time):
        out.append(_length_prefixed(b"tt", value.isoformat().encode()))
    else:
        raise _NoEncoding(value)


def _encode_mapping(value: Mapping[Any, Any], out: list[bytes]) -> None:
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


def reference_digest(task_name: str, arguments: Mapping[str, Any]) -> str:
    out: list[bytes] = []
    try:
        _encode(task_name, out)
        _encode_mapping(arguments, out)
    except _NoEncoding as exc:
        cls = type(exc.value)
        raise UnsupportedArgumentError(
            f"task {task_name}: argument {exc.path()} has type "
            f"{cls.__module__}.{cls.__qualname__}, which has no stable lock-key encoding "
            f"(supported: {_SUPPORTED}). Name the arguments that identify the work with "
            "lock_on=(...), or give lock_key=callable returning a string"
        ) from None
    return hashlib.sha256(b"".join(out)).hexdigest()


def reference_bind(keyer: ArgumentKeyer, args: Any, kwargs: Any) -> dict[str, Any]:
    """The first release's binding (its argument order decides which error is reported)."""
    parameters = keyer.signature.parameters
    if all(p.kind is p.POSITIONAL_OR_KEYWORD for p in parameters.values()):
        names = tuple(parameters)
        defaults = {p.name: p.default for p in parameters.values() if p.default is not p.empty}
        if args is None or len(args) <= len(names):
            arguments = dict(zip(names, args or ()))
            fits = True
            if kwargs:
                fits = not any(key in arguments or key not in parameters for key in kwargs)
                arguments.update(kwargs)
            if fits and len(arguments) < len(names):
                for name in names:
                    if name not in arguments:
                        if name not in defaults:
                            fits = False
                            break
                        arguments[name] = defaults[name]
            if fits:
                return arguments
    try:
        bound = keyer.signature.bind(*(args or ()), **(kwargs or {}))
    except TypeError:
        raise LockKeyError("arguments do not match") from None
    bound.apply_defaults()
    return dict(bound.arguments)


def reference_name(keyer: ArgumentKeyer, args: Any, kwargs: Any) -> str:
    if keyer.lock_key is not None:
        identity: Mapping[str, Any] = {"lock_key": keyer.lock_key(*(args or ()), **(kwargs or {}))}
    else:
        identity = reference_bind(keyer, args, kwargs)
        if keyer.lock_on is not None:
            identity = {name: identity[name] for name in keyer.lock_on}
    return f"{keyer.namespace}{keyer.task_name}:{reference_digest(keyer.task_name, identity)}"


def outcome(compute: Callable[[], str]) -> tuple[type, str]:
    """A name, or the error computing it raised (its type and message)."""
    try:
        return str, compute()
    except LockKeyError as exc:
        return type(exc), str(exc) if isinstance(exc, UnsupportedArgumentError) else ""


# --- tasks and values ----------------------------------------------------------------------


def single(x: Any) -> None: ...


def transfer(account_id: Any, amount: Any, note: Any = None, when: Any = 0) -> None: ...


def all_defaults(a: Any = 1, b: Any = "b") -> None: ...


def variadic(a: Any, *args: Any, **kwargs: Any) -> None: ...


def keyword_only(a: Any, *, flag: Any = False) -> None: ...


def positional_only(a: Any, /, b: Any = 2) -> None: ...


def bound_task(self: Any, account_id: Any, amount: Any = 1) -> None: ...


def no_parameters() -> None: ...


class Color(enum.Enum):
    RED = 1
    GREEN = "g"
    NESTED = (1, "x")


class Level(enum.IntEnum):
    LOW = 1


class Mode(str, enum.Enum):
    FAST = "fast"


class Text(str):
    def __str__(self) -> str:
        return "lie"


class Number(int):
    def __index__(self) -> int:
        return 0


class Real(float):
    def __repr__(self) -> str:
        return "0.0"


class Unsupported:
    pass


offsets = st.builds(
    dt.timezone,
    st.timedeltas(min_value=dt.timedelta(hours=-23), max_value=dt.timedelta(hours=23)),
)
texts = st.text() | st.text(alphabet="a\u00e9\U0001f600\ud800\udfff;:s1", max_size=6)
hashable_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),  # NaN included: distinct NaN keys tie on their encoding
    texts,
    st.binary(max_size=8),
    st.uuids(),
    st.dates(),
    st.sampled_from([*Color, *Level, *Mode]),
    st.integers().map(Number),
    texts.map(Text),
)
leaves = st.one_of(
    hashable_leaves,
    st.integers(min_value=2**64, max_value=2**300),
    st.floats().map(Real),
    st.binary(max_size=8).map(bytearray),
    st.binary(max_size=8).map(memoryview),
    st.decimals(),  # NaN and infinities included
    st.sampled_from([Decimal("sNaN"), Decimal("-NaN12"), Decimal("1.500"), Decimal("-0E+3")]),
    st.datetimes(min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30)),
    st.datetimes(
        min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30), timezones=offsets
    ),
    st.times(timezones=st.none() | offsets),
)
keys = hashable_leaves | st.tuples(hashable_leaves, hashable_leaves)


def containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    mappings = st.dictionaries(keys, children, max_size=4)
    return st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(tuple),
        mappings,
        mappings.map(collections.OrderedDict),
        mappings.map(types.MappingProxyType),
    )


values = st.recursive(leaves, containers, max_leaves=12)
unsupported_keys = st.sampled_from([Unsupported, frozenset, complex, dt.timedelta]).map(
    lambda make: make()
)
unsupported = unsupported_keys | st.just(set()) | st.just({Unsupported()})
# values with, here and there, one that has no encoding (several per call, at any depth)
poisoned = st.recursive(
    leaves | unsupported,
    lambda children: containers(children) | st.dictionaries(unsupported_keys, children, max_size=2),
    max_leaves=8,
)

# --- agreement with the reference ----------------------------------------------------------


@settings(max_examples=500, deadline=None)
@given(arguments=st.dictionaries(texts, values, max_size=4), task=texts)
def test_canonical_digest_equals_the_reference(arguments: dict[str, Any], task: str) -> None:
    assert canonical_digest(task, arguments) == reference_digest(task, arguments)


@settings(max_examples=500, deadline=None)
@given(value=values)
def test_single_argument_name_equals_the_reference(value: Any) -> None:
    k = ArgumentKeyer("tasks.single", single)
    assert k.name((value,), {}) == reference_name(k, (value,), {})
    assert k.name(None, {"x": value}) == reference_name(k, None, {"x": value})


SIGNATURES: dict[str, tuple[Callable[..., Any], dict[str, Any]]] = {
    "defaults": (transfer, {}),
    "all-defaults": (all_defaults, {}),
    "lock-on-one": (transfer, {"lock_on": "amount"}),
    "lock-on-subset": (transfer, {"lock_on": ("note", "account_id")}),
    "lock-on-repeated": (transfer, {"lock_on": ("when", "amount", "when")}),
    "variadic": (variadic, {}),
    "variadic-lock-on": (variadic, {"lock_on": ("kwargs", "a")}),
    "keyword-only": (keyword_only, {}),
    "positional-only": (positional_only, {}),
    "skip-first": (bound_task, {"skip_first": True}),
    "self": (bound_task, {}),
    "no-parameters": (no_parameters, {}),
    "namespace": (transfer, {"namespace": "ns-"}),
}


def draw_call(data: st.DataObject, k: ArgumentKeyer, values: st.SearchStrategy[Any]) -> Any:
    """Arguments for ``k``'s task, positional then keyword (in any order), mostly fitting its
    signature: now and then one too many, one missing, or one that is no parameter."""
    parameters = list(k.signature.parameters.values())
    positional = [p for p in parameters if p.kind < p.KEYWORD_ONLY]
    count = data.draw(st.integers(min_value=0, max_value=len(positional)))
    args: Any = [data.draw(values) for _ in range(count)]
    rest = [  # given by keyword: each required one, and the others as drawn
        p.name
        for p in parameters[count:]
        if p.kind not in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL)
        and ((p.default is p.empty and p.kind is not p.VAR_KEYWORD) or data.draw(st.booleans()))
    ]
    odd = data.draw(st.sampled_from(["none"] * 5 + ["extra", "missing", "other"]))
    keywords = data.draw(st.permutations(rest))
    keywords = keywords[: len(keywords) - 1] if odd == "missing" else keywords
    kwargs: Any = {
        name: data.draw(values) for name in [*keywords, *(["other"] if odd == "other" else [])]
    }
    if odd == "extra":
        args.append(data.draw(values))
    args = data.draw(st.sampled_from([args, tuple(args), *([None] if not args else [])]))
    return args, data.draw(st.sampled_from([kwargs, *([None] if not kwargs else [])]))


@pytest.mark.parametrize(("func", "options"), SIGNATURES.values(), ids=SIGNATURES.keys())
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_call_name_equals_the_reference(
    func: Callable[..., Any], options: dict[str, Any], data: st.DataObject
) -> None:
    k = ArgumentKeyer("tasks.call", func, **options)
    args, kwargs = draw_call(data, k, values)
    expected = outcome(lambda: reference_name(k, args, kwargs))
    assert outcome(lambda: k.name(args, kwargs)) == expected


@settings(max_examples=300, deadline=None)
@given(key=texts, args=st.lists(st.integers(), max_size=3))
def test_lock_key_name_equals_the_reference(key: str, args: list[int]) -> None:
    k = ArgumentKeyer("tasks.keyed", variadic, lock_key=lambda *a, **kw: key)
    assert k.name([0, *args], {"extra": 1}) == reference_name(k, [0, *args], {"extra": 1})


@pytest.mark.parametrize(("func", "options"), SIGNATURES.values(), ids=SIGNATURES.keys())
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_unsupported_argument_error_equals_the_reference(
    func: Callable[..., Any], options: dict[str, Any], data: st.DataObject
) -> None:
    # the same message, naming the same argument and path, when several have no encoding
    k = ArgumentKeyer("tasks.call", func, **options)
    args, kwargs = draw_call(data, k, poisoned)
    assert outcome(lambda: k.name(args, kwargs)) == outcome(lambda: reference_name(k, args, kwargs))


# --- literal names, computed by the reference ----------------------------------------------

UTC = dt.timezone.utc
PLUS_2 = dt.timezone(dt.timedelta(hours=2))

# (task function, keyer options, args, kwargs) by name: every type and option at least once
PINNED_CALLS: dict[str, tuple[Callable[..., Any], dict[str, Any], Any, Any]] = {
    "int": (single, {}, [7], {}),
    "int-as-keyword": (single, {}, None, {"x": 7}),
    "negative-int": (single, {}, (-42,), {}),
    "big-int": (single, {}, (2**200,), {}),
    "int-beyond-str-digits": (single, {}, (10**5000,), {}),
    "int-subclass": (single, {}, (Number(7),), {}),
    "true": (single, {}, (True,), {}),
    "false": (single, {}, (False,), {}),
    "none": (single, {}, (None,), {}),
    "float": (single, {}, (3.25,), {}),
    "negative-zero": (single, {}, (-0.0,), {}),
    "inf": (single, {}, (float("inf"),), {}),
    "nan": (single, {}, (float("nan"),), {}),
    "float-subclass": (single, {}, (Real(2.5),), {}),
    "str": (single, {}, ("héllo",), {}),
    "empty-str": (single, {}, ("",), {}),
    "lone-surrogate": (single, {}, ("\ud800",), {}),
    "str-subclass": (single, {}, (Text("acct-1"),), {}),
    "bytes": (single, {}, (b"\x00\xffabc",), {}),
    "bytearray": (single, {}, (bytearray(b"abc"),), {}),
    "list": (single, {}, ([1, "a", None, [2.5]],), {}),
    "tuple": (single, {}, ((7, "b"),), {}),
    "empty-list": (single, {}, ([],), {}),
    "dict": (single, {}, ({"b": 1, "a": [2, {"c": None}]},), {}),
    "dict-mixed-keys": (
        single,
        {},
        ({1: "a", "1": "b", 2.5: "c", None: 0, (1, 2): 3, b"k": 4},),
        {},
    ),
    "dict-nan-keys": (single, {}, ({float("nan"): "b", float("nan"): "a"},), {}),
    "empty-dict": (single, {}, ({},), {}),
    "ordered-dict": (single, {}, (collections.OrderedDict(z=1, a=2),), {}),
    "decimal": (single, {}, (Decimal("12.50"),), {}),
    "decimal-infinity": (single, {}, (Decimal("-Infinity"),), {}),
    "decimal-snan": (single, {}, (Decimal("sNaN12"),), {}),
    "uuid": (single, {}, (uuid.UUID("12345678-1234-5678-1234-567812345678"),), {}),
    "date": (single, {}, (dt.date(2024, 2, 29),), {}),
    "naive-datetime": (single, {}, (dt.datetime(2024, 2, 29, 13, 5, 7, 123456),), {}),
    "aware-datetime": (single, {}, (dt.datetime(2024, 2, 29, 13, 5, tzinfo=PLUS_2),), {}),
    "utc-datetime": (single, {}, (dt.datetime(2024, 2, 29, 11, 5, tzinfo=UTC),), {}),
    "time": (single, {}, (dt.time(13, 5, 7, 123),), {}),
    "aware-time": (single, {}, (dt.time(13, 5, tzinfo=PLUS_2),), {}),
    "enum": (single, {}, (Color.RED,), {}),
    "enum-tuple-value": (single, {}, (Color.NESTED,), {}),
    "int-enum": (single, {}, (Level.LOW,), {}),
    "str-enum": (single, {}, (Mode.FAST,), {}),
    "positional": (transfer, {}, ("acct-1", 100, "n", 5), {}),
    "defaults": (transfer, {}, ("acct-1", 100), {}),
    "keywords": (transfer, {}, ("acct-1",), {"note": "x", "amount": 100}),
    "all-defaults": (all_defaults, {}, None, None),
    "lock-on": (transfer, {"lock_on": "amount"}, ("acct-1", 100), {}),
    "lock-on-subset": (transfer, {"lock_on": ("note", "account_id")}, ("acct-1", 100), {}),
    "lock-key": (transfer, {"lock_key": lambda *a, **k: f"acct-{a[0]}"}, ("1", 100), {}),
    "variadic": (variadic, {}, (1, 2, 3), {"extra": "e"}),
    "variadic-lock-on": (variadic, {"lock_on": "kwargs"}, (1,), {"extra": "e"}),
    "keyword-only": (keyword_only, {}, (1,), {"flag": True}),
    "positional-only": (positional_only, {}, (1,), {}),
    "skip-first": (bound_task, {"skip_first": True}, (7,), {}),
    "self": (bound_task, {}, ("me", 7), {}),
    "no-parameters": (no_parameters, {}, None, None),
    "namespace": (single, {"namespace": "staging_"}, (7,), {}),
}
# the hashes in the names the first release computed for PINNED_CALLS (task tasks.pinned)
PINNED_DIGESTS: dict[str, str] = {
    "int": "0abafc1d0dbb2a96f5716bd56edf86d2c9c3d8928453294b54fec84ea9d7f142",
    "int-as-keyword": "0abafc1d0dbb2a96f5716bd56edf86d2c9c3d8928453294b54fec84ea9d7f142",
    "negative-int": "a4d5f2395d137fdd1c2da5a123f3478fdceb26fce3cfb54363d944589cbe4c8d",
    "big-int": "cd091d224e2c4fbe0e59c64d8850a91cf6d9e50e101bd77afc1560be21e244ff",
    "int-beyond-str-digits": "f75acdfd392eb322206758eb87127670e3b66225fd05b294b6eae295f9136b5b",
    "int-subclass": "0abafc1d0dbb2a96f5716bd56edf86d2c9c3d8928453294b54fec84ea9d7f142",
    "true": "da7a4137485180d3735517f337eda7b415fcd260effda9041bb97864d09fce29",
    "false": "ca224578ecf00b7ff311b6ac8b92cfdcd3d2bf79f6c796c867c96972b4f55c65",
    "none": "389880800cde7a9e0ee80e25a92477fb93b17f854207ab6a6576a31039be7d86",
    "float": "e0d66d532782c674d362b6ce2be88b92bd23eb52380851e0f35af8542d03248c",
    "negative-zero": "390b83252d7d4a3d07770f344fa92cccd2d5c59715caac15627d81be5aa66b99",
    "inf": "10ee176a88ce6f02dcd33422d817058a3bf7145191d3c16b7fe3eca0440292e6",
    "nan": "fa6195f595d4cfef454efca82d99fbe70c2e48c9e4e1066477455b32dc0aabaa",
    "float-subclass": "60572cb3a1a7168b5597aac08373d65e13f6199ea04795e6b651c45e49221b65",
    "str": "c3e7f5df5ba0fce00f30e2fc96f6a75ced0baaca7d5881594238838598b3e5bb",
    "empty-str": "e61eab45d9463c228334148418ee3b994be41ac68a7c944e345e636d85813855",
    "lone-surrogate": "5215cef69f0a0d7c2eae3f84d37646e3e5a7fef39c984c1bdfa00c5ff62abb96",
    "str-subclass": "aa4440c2bbd94269bbfc07f57a12de27d2b9ac5de719ee516a24f3d18b8be5e9",
    "bytes": "6a38bfe456161ab10e6decd5e34eac1f6c62dbdd9ff02bb5f06372b843ce1156",
    "bytearray": "45df557945d3e1a127f7dfafe41ac410e1dee2d303ad6d97c00fa18286f8ef92",
    "list": "2cdd8a8269fdd1b7e5b6a5b5ff7c18420edd3d5c1bdfc7808faaed46795832f4",
    "tuple": "c08df62809891fac3d99202f1566971328bb849db9eed1085ca6cb683826b5e3",
    "empty-list": "bce3d07844e4ce09c16fdb47e3eda0f3070753c59cdaf43ed354502b889a103f",
    "dict": "1c356068b24629a6d3306889678087231438698a5fea697bc4b9b44988d0bce1",
    "dict-mixed-keys": "bd4e4eb9233bc2d532bf9281de0e4cf2e95401fe0f1f17108b0f5c91b538db76",
    "dict-nan-keys": "a407f09836c7d7a02b9d11718de3401e627e1562a6153f3236bcee408398efec",
    "empty-dict": "e418ea0544b5b3a6cce6bdf7413371cabfd92ea1d4da6ff344e0921e937c6929",
    "ordered-dict": "17a668bb614ae45ded34b714ebc794cd22d46e0ca55708e6eceda9f69cb0c9b4",
    "decimal": "835f8691aa661b4198ba2210b0a56597e107c08060a7822978b5274d7a68ada9",
    "decimal-infinity": "ae29abe5d1d5905852a57928277195c9c8c56ffdbdc407d34ac79c084efc0f08",
    "decimal-snan": "72fecf04007988f746f1104ddf1ac97bdd74b176dc4cc0b88f02070aa081dc72",
    "uuid": "ca1befdc7df5999a4734c8aa8f015e24cb69afee986fd16c585c7e46314a053f",
    "date": "cf7a5a2aae2d645a047c70a4369d92c95e55c441312b5d9e50fe288d5469f330",
    "naive-datetime": "6f9cef44d89fc917c994f039bfd31fed9a0d1300eada5eb6ba326d609b4fe516",
    "aware-datetime": "7edec6c5b3230461336dad73ba24ee996d35cdebf64412b6a99ff9b45ede1f0a",
    "utc-datetime": "7edec6c5b3230461336dad73ba24ee996d35cdebf64412b6a99ff9b45ede1f0a",
    "time": "9da5e76b1f0b305759f7b0e2b1d3a575cf84750367e95cd801b6fe545b8e2b77",
    "aware-time": "19e9a9845ee1372f60ba7e2a53cc4c203aa681e07a752b5ebe662f3178c9be74",
    "enum": "98297719897dbf71b83980131a1782e3b2768f23f5aeb3302f21efa3e948aced",
    "enum-tuple-value": "90e1f2f381067cd40e0f5e2b0e95f7d3ab4a33c152d286c1ede4e298bc02f6db",
    "int-enum": "badeb064efc3715245e19ef56956d6b4dd42f9b222ccfa5c54964a9c953681fd",
    "str-enum": "d6adb94bc1e2c12484df52f2a73b630e7b8e651d20c2e9fa169798df814d2e15",
    "positional": "e550dd445e7d6be3049bffeb88df5fbce0daa3806d5ab5261590d3afc6f2e559",
    "defaults": "760c04e104d15eeabd7332a2a643715f31f4761913cfe00c2542a895e1968a18",
    "keywords": "97d2c0a7a517f562bf7b0b2d52ee17aaab9f7d4c57ee3d71459e0fd90f951c29",
    "all-defaults": "ff22a1b33098bcb3222872d772dfe9c229da130172a98be1289350c55d18e034",
    "lock-on": "7e51bd98ef1b38dff1db5dc6813483d15d30b5ef92131cedbd166ebcaa53db82",
    "lock-on-subset": "84d1156a083dc03183d149c5bbe8fdfa51865779faa56a86a935188b52ed02fa",
    "lock-key": "0f478c2bd62c2e4cdb886398bd4b938348182bef27bde298772c24433bf6e5d9",
    "variadic": "5f67308fa889ee0b1b2c62e48bacdc597c999ccdbcc176fbdc20fdc9a8147855",
    "variadic-lock-on": "db60acd962bff486fd9d91a364ed97b6a7c86a5119238f885af5cea43c9be526",
    "keyword-only": "0ece9c5edda8b582c558275d247f5a9c1043de430d0b38504b9fb2c7315dcd3e",
    "positional-only": "016b85da120364e23d612c99e64f65c0f869828a7c7d27bbff40d2323902143d",
    "skip-first": "8d408a29a0b4bd9970d1e7f1fd8a21763f9980f3205442178a671e3f0da72135",
    "self": "837c3565f2ab96efe72c3c7a8fdc510e804c6afa64343898ba94e34ae463ae07",
    "no-parameters": "463ac82bf3e3869694a2886a25e0c746323709a9dd2320843e3b8b56d7137c35",
    "namespace": "0abafc1d0dbb2a96f5716bd56edf86d2c9c3d8928453294b54fec84ea9d7f142",
}


@pytest.mark.parametrize(
    ("func", "options", "args", "kwargs", "digest"),
    [(*call, PINNED_DIGESTS[key]) for key, call in PINNED_CALLS.items()],
    ids=PINNED_CALLS.keys(),
)
def test_name_is_the_one_the_first_release_computed(
    func: Callable[..., Any], options: dict[str, Any], args: Any, kwargs: Any, digest: str
) -> None:
    k = ArgumentKeyer("tasks.pinned", func, **options)
    assert k.name(args, kwargs) == f"{options.get('namespace', '')}tasks.pinned:{digest}"


def test_the_digest_format_is_stable_across_releases() -> None:
    # Workers of two versions must name the same call's lock alike (rolling upgrades). The
    # format last changed before the first release (one hash over one buffer, no per-key
    # hashes); changing it again is a breaking change to announce.
    args = {
        "s": "héllo",
        "n": 7,
        "d": {"k1": 1, "k2": [1.5, None, True]},
        "x": Decimal("1.50"),
        "u": uuid.UUID(int=5),
        "b": b"b",
    }
    expected = "290e67632432347e0ca013044e7b5d29d3aba01e0cafa8c12e90a9fa582a967f"
    assert canonical_digest("tasks.t", args) == expected
