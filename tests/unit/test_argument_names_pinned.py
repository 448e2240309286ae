"""Lock names never change: every call hashes the bytes the first release hashed.

Workers of two versions run side by side during a rolling upgrade and must name each call's
lock alike, so ``arguments.py`` may get faster but never different. The table below is the
guard: calls covering every branch of the encoder and of the binding (types, nesting, keyword
order, defaults, ``lock_on``, ``lock_key``, namespaces, refused calls), each with the name (or
the error) the first release computed for it, pasted as literals. A change of any name fails.
"""

# ruff: noqa: E501 (a table of literal names)
from __future__ import annotations

import collections
import datetime as dt
import enum
import types
import uuid
from decimal import Decimal
from typing import Any, Callable, Union

import pytest

from celery_singleton_lock.arguments import ArgumentKeyer, canonical_digest
from celery_singleton_lock.errors import LockKeyError, UnsupportedArgumentError

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


UTC = dt.timezone.utc
PLUS_2 = dt.timezone(dt.timedelta(hours=2))
NAME = "tasks.pinned"
#: what an unsupported argument's error says after its path and type
NO_ENCODING = (
    "which has no stable lock-key encoding (supported: str, int, float, bool, None, list/tuple, "
    "dict, Decimal, UUID, date/datetime/time, Enum, bytes, pydantic models). Name the arguments "
    "that identify the work with lock_on=(...), or give lock_key=callable returning a string"
)


def refused(error: type[LockKeyError], message: str) -> tuple[type[LockKeyError], str]:
    """A call whose name cannot be computed: the error and how its message starts (a binding
    error ends with inspect's own words, which change between Python versions)."""
    return error, message


Expected = Union[str, tuple[type[LockKeyError], str]]


# (task function, keyer options, args, kwargs) by id: every type and option at least once
CALLS: dict[str, tuple[Callable[..., Any], dict[str, Any], Any, Any]] = {
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
    "integral-float": (single, {}, (7.0,), {}),
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
    "memoryview": (single, {}, (memoryview(b"abc"),), {}),
    "list": (single, {}, ([1, "a", None, [2.5]],), {}),
    "tuple": (single, {}, ((7, "b"),), {}),
    "empty-list": (single, {}, ([],), {}),
    "empty-tuple": (single, {}, ((),), {}),
    "nested": (single, {}, ([(1, [b"x", {"k": (None, True)}])],), {}),
    "dict": (single, {}, ({"b": 1, "a": [2, {"c": None}]},), {}),
    "dict-other-order": (single, {}, ({"a": [2, {"c": None}], "b": 1},), {}),
    "dict-mixed-keys": (
        single,
        {},
        ({1: "a", "1": "b", 2.5: "c", None: 0, (1, 2): 3, b"k": 4},),
        {},
    ),
    "dict-nan-keys": (single, {}, ({float("nan"): "b", float("nan"): "a"},), {}),
    "empty-dict": (single, {}, ({},), {}),
    "ordered-dict": (single, {}, (collections.OrderedDict(z=1, a=2),), {}),
    "mapping-proxy": (single, {}, (types.MappingProxyType({"a": 2, "z": 1}),), {}),
    "decimal": (single, {}, (Decimal("12.50"),), {}),
    "decimal-negative-zero": (single, {}, (Decimal("-0E+3"),), {}),
    "decimal-infinity": (single, {}, (Decimal("-Infinity"),), {}),
    "decimal-nan": (single, {}, (Decimal("-NaN12"),), {}),
    "decimal-snan": (single, {}, (Decimal("sNaN12"),), {}),
    "uuid": (single, {}, (uuid.UUID("12345678-1234-5678-1234-567812345678"),), {}),
    "date": (single, {}, (dt.date(2024, 2, 29),), {}),
    "naive-datetime": (single, {}, (dt.datetime(2024, 2, 29, 13, 5, 7, 123456),), {}),
    "aware-datetime": (single, {}, (dt.datetime(2024, 2, 29, 13, 5, tzinfo=PLUS_2),), {}),
    "utc-datetime": (single, {}, (dt.datetime(2024, 2, 29, 11, 5, tzinfo=UTC),), {}),
    "time": (single, {}, (dt.time(13, 5, 7, 123),), {}),
    "aware-time": (single, {}, (dt.time(13, 5, tzinfo=PLUS_2),), {}),
    "enum": (single, {}, (Color.RED,), {}),
    "enum-str-value": (single, {}, (Color.GREEN,), {}),
    "enum-tuple-value": (single, {}, (Color.NESTED,), {}),
    "int-enum": (single, {}, (Level.LOW,), {}),
    "str-enum": (single, {}, (Mode.FAST,), {}),
    "positional": (transfer, {}, ("acct-1", 100, "n", 5), {}),
    "defaults": (transfer, {}, ("acct-1", 100), {}),
    "defaults-given": (transfer, {}, ("acct-1", 100, None, 0), {}),
    "keywords": (transfer, {}, ("acct-1",), {"note": "x", "amount": 100}),
    "keywords-other-order": (transfer, {}, ("acct-1",), {"amount": 100, "note": "x"}),
    "all-keywords": (transfer, {}, None, {"when": 5, "amount": 100, "account_id": "acct-1"}),
    "all-defaults": (all_defaults, {}, None, None),
    "lock-on": (transfer, {"lock_on": "amount"}, ("acct-1", 100), {}),
    "lock-on-subset": (transfer, {"lock_on": ("note", "account_id")}, ("acct-1", 100), {}),
    "lock-on-repeated": (transfer, {"lock_on": ("when", "amount", "when")}, ("acct-1", 100), {}),
    "lock-on-ignores-the-rest": (
        transfer,
        {"lock_on": ("note", "account_id")},
        ("acct-1", 999),
        {"when": 9},
    ),
    "lock-key": (transfer, {"lock_key": lambda *a, **k: f"acct-{a[0]}"}, ("1", 100), {}),
    "lock-key-keywords": (variadic, {"lock_key": lambda *a, **k: str(k)}, (0, 1), {"e": 1}),
    "variadic": (variadic, {}, (1, 2, 3), {"extra": "e"}),
    "variadic-lock-on": (variadic, {"lock_on": "kwargs"}, (1,), {"extra": "e"}),
    "variadic-lock-on-two": (variadic, {"lock_on": ("kwargs", "a")}, (1, 2), {"z": 0, "y": 1}),
    "keyword-only": (keyword_only, {}, (1,), {"flag": True}),
    "keyword-only-default": (keyword_only, {}, (1,), {}),
    "positional-only": (positional_only, {}, (1,), {}),
    "skip-first": (bound_task, {"skip_first": True}, (7,), {}),
    "self": (bound_task, {}, ("me", 7), {}),
    "no-parameters": (no_parameters, {}, None, None),
    "namespace": (single, {"namespace": "staging_"}, (7,), {}),
    "too-many-arguments": (single, {}, (1, 2), {}),
    "missing-argument": (transfer, {}, ("acct-1",), {}),
    "unknown-keyword": (single, {}, (1,), {"other": 2}),
    "positional-only-by-keyword": (positional_only, {}, None, {"a": 1}),
    "unsupported": (single, {}, ({1},), {}),
    "unsupported-nested": (single, {}, ({"a": [1, Unsupported()]},), {}),
    "unsupported-key": (single, {}, ({frozenset(): 1},), {}),
    "unsupported-not-in-lock-on": (transfer, {"lock_on": "amount"}, ({1}, 5), {}),
    "unsupported-in-lock-on": (transfer, {"lock_on": "amount"}, (1, dt.timedelta(1)), {}),
}

#: the name (or the error) the first release computed for each of CALLS, task tasks.pinned
EXPECTED: dict[str, Expected] = {
    "int": "tasks.pinned:0abafc1d0dbb2a96f5716bd56edf86d2c9c3d8928453294b54fec84ea9d7f142",
    "int-as-keyword": "tasks.pinned:0abafc1d0dbb2a96f5716bd56edf86d2c9c3d8928453294b54fec84ea9d7f142",
    "negative-int": "tasks.pinned:a4d5f2395d137fdd1c2da5a123f3478fdceb26fce3cfb54363d944589cbe4c8d",
    "big-int": "tasks.pinned:cd091d224e2c4fbe0e59c64d8850a91cf6d9e50e101bd77afc1560be21e244ff",
    "int-beyond-str-digits": "tasks.pinned:f75acdfd392eb322206758eb87127670e3b66225fd05b294b6eae295f9136b5b",
    "int-subclass": "tasks.pinned:0abafc1d0dbb2a96f5716bd56edf86d2c9c3d8928453294b54fec84ea9d7f142",
    "true": "tasks.pinned:da7a4137485180d3735517f337eda7b415fcd260effda9041bb97864d09fce29",
    "false": "tasks.pinned:ca224578ecf00b7ff311b6ac8b92cfdcd3d2bf79f6c796c867c96972b4f55c65",
    "none": "tasks.pinned:389880800cde7a9e0ee80e25a92477fb93b17f854207ab6a6576a31039be7d86",
    "float": "tasks.pinned:e0d66d532782c674d362b6ce2be88b92bd23eb52380851e0f35af8542d03248c",
    "integral-float": "tasks.pinned:109c370271d63891cc994d7c19dc50035fee8b630ffa6826e1896a9bdc6c3692",
    "negative-zero": "tasks.pinned:390b83252d7d4a3d07770f344fa92cccd2d5c59715caac15627d81be5aa66b99",
    "inf": "tasks.pinned:10ee176a88ce6f02dcd33422d817058a3bf7145191d3c16b7fe3eca0440292e6",
    "nan": "tasks.pinned:fa6195f595d4cfef454efca82d99fbe70c2e48c9e4e1066477455b32dc0aabaa",
    "float-subclass": "tasks.pinned:60572cb3a1a7168b5597aac08373d65e13f6199ea04795e6b651c45e49221b65",
    "str": "tasks.pinned:c3e7f5df5ba0fce00f30e2fc96f6a75ced0baaca7d5881594238838598b3e5bb",
    "empty-str": "tasks.pinned:e61eab45d9463c228334148418ee3b994be41ac68a7c944e345e636d85813855",
    "lone-surrogate": "tasks.pinned:5215cef69f0a0d7c2eae3f84d37646e3e5a7fef39c984c1bdfa00c5ff62abb96",
    "str-subclass": "tasks.pinned:aa4440c2bbd94269bbfc07f57a12de27d2b9ac5de719ee516a24f3d18b8be5e9",
    "bytes": "tasks.pinned:6a38bfe456161ab10e6decd5e34eac1f6c62dbdd9ff02bb5f06372b843ce1156",
    "bytearray": "tasks.pinned:45df557945d3e1a127f7dfafe41ac410e1dee2d303ad6d97c00fa18286f8ef92",
    "memoryview": "tasks.pinned:45df557945d3e1a127f7dfafe41ac410e1dee2d303ad6d97c00fa18286f8ef92",
    "list": "tasks.pinned:2cdd8a8269fdd1b7e5b6a5b5ff7c18420edd3d5c1bdfc7808faaed46795832f4",
    "tuple": "tasks.pinned:c08df62809891fac3d99202f1566971328bb849db9eed1085ca6cb683826b5e3",
    "empty-list": "tasks.pinned:bce3d07844e4ce09c16fdb47e3eda0f3070753c59cdaf43ed354502b889a103f",
    "empty-tuple": "tasks.pinned:bce3d07844e4ce09c16fdb47e3eda0f3070753c59cdaf43ed354502b889a103f",
    "nested": "tasks.pinned:368fbf530eed12e23c0e696b94f22a29caa082636fdf12429259bf2281705f2e",
    "dict": "tasks.pinned:1c356068b24629a6d3306889678087231438698a5fea697bc4b9b44988d0bce1",
    "dict-other-order": "tasks.pinned:1c356068b24629a6d3306889678087231438698a5fea697bc4b9b44988d0bce1",
    "dict-mixed-keys": "tasks.pinned:bd4e4eb9233bc2d532bf9281de0e4cf2e95401fe0f1f17108b0f5c91b538db76",
    "dict-nan-keys": "tasks.pinned:a407f09836c7d7a02b9d11718de3401e627e1562a6153f3236bcee408398efec",
    "empty-dict": "tasks.pinned:e418ea0544b5b3a6cce6bdf7413371cabfd92ea1d4da6ff344e0921e937c6929",
    "ordered-dict": "tasks.pinned:17a668bb614ae45ded34b714ebc794cd22d46e0ca55708e6eceda9f69cb0c9b4",
    "mapping-proxy": "tasks.pinned:17a668bb614ae45ded34b714ebc794cd22d46e0ca55708e6eceda9f69cb0c9b4",
    "decimal": "tasks.pinned:835f8691aa661b4198ba2210b0a56597e107c08060a7822978b5274d7a68ada9",
    "decimal-negative-zero": "tasks.pinned:8885d7d75eb1c3eeae0f00ee99d51baecbb74de9118122eeb7b1cf52e124c6e8",
    "decimal-infinity": "tasks.pinned:ae29abe5d1d5905852a57928277195c9c8c56ffdbdc407d34ac79c084efc0f08",
    "decimal-nan": "tasks.pinned:d26381519df7c25793e9ce7ddeab24566b6031d0435784a06bccac12b159da11",
    "decimal-snan": "tasks.pinned:72fecf04007988f746f1104ddf1ac97bdd74b176dc4cc0b88f02070aa081dc72",
    "uuid": "tasks.pinned:ca1befdc7df5999a4734c8aa8f015e24cb69afee986fd16c585c7e46314a053f",
    "date": "tasks.pinned:cf7a5a2aae2d645a047c70a4369d92c95e55c441312b5d9e50fe288d5469f330",
    "naive-datetime": "tasks.pinned:6f9cef44d89fc917c994f039bfd31fed9a0d1300eada5eb6ba326d609b4fe516",
    "aware-datetime": "tasks.pinned:7edec6c5b3230461336dad73ba24ee996d35cdebf64412b6a99ff9b45ede1f0a",
    "utc-datetime": "tasks.pinned:7edec6c5b3230461336dad73ba24ee996d35cdebf64412b6a99ff9b45ede1f0a",
    "time": "tasks.pinned:9da5e76b1f0b305759f7b0e2b1d3a575cf84750367e95cd801b6fe545b8e2b77",
    "aware-time": "tasks.pinned:19e9a9845ee1372f60ba7e2a53cc4c203aa681e07a752b5ebe662f3178c9be74",
    "enum": "tasks.pinned:98297719897dbf71b83980131a1782e3b2768f23f5aeb3302f21efa3e948aced",
    "enum-str-value": "tasks.pinned:76a83116bf1acbfafeec45b89cc20a3bca6fb79948092af1dff6a5ad3f7c8439",
    "enum-tuple-value": "tasks.pinned:90e1f2f381067cd40e0f5e2b0e95f7d3ab4a33c152d286c1ede4e298bc02f6db",
    "int-enum": "tasks.pinned:badeb064efc3715245e19ef56956d6b4dd42f9b222ccfa5c54964a9c953681fd",
    "str-enum": "tasks.pinned:d6adb94bc1e2c12484df52f2a73b630e7b8e651d20c2e9fa169798df814d2e15",
    "positional": "tasks.pinned:e550dd445e7d6be3049bffeb88df5fbce0daa3806d5ab5261590d3afc6f2e559",
    "defaults": "tasks.pinned:760c04e104d15eeabd7332a2a643715f31f4761913cfe00c2542a895e1968a18",
    "defaults-given": "tasks.pinned:760c04e104d15eeabd7332a2a643715f31f4761913cfe00c2542a895e1968a18",
    "keywords": "tasks.pinned:97d2c0a7a517f562bf7b0b2d52ee17aaab9f7d4c57ee3d71459e0fd90f951c29",
    "keywords-other-order": "tasks.pinned:97d2c0a7a517f562bf7b0b2d52ee17aaab9f7d4c57ee3d71459e0fd90f951c29",
    "all-keywords": "tasks.pinned:314cec14e7144b92a2b5110fdf18daeb22372b8546b99323a66d3b073ae863b5",
    "all-defaults": "tasks.pinned:ff22a1b33098bcb3222872d772dfe9c229da130172a98be1289350c55d18e034",
    "lock-on": "tasks.pinned:7e51bd98ef1b38dff1db5dc6813483d15d30b5ef92131cedbd166ebcaa53db82",
    "lock-on-subset": "tasks.pinned:84d1156a083dc03183d149c5bbe8fdfa51865779faa56a86a935188b52ed02fa",
    "lock-on-repeated": "tasks.pinned:4cdfdc450098c2c1719cf88aa39ca6e7d44d2e1950d2a7ad9920e422508f2bb7",
    "lock-on-ignores-the-rest": "tasks.pinned:84d1156a083dc03183d149c5bbe8fdfa51865779faa56a86a935188b52ed02fa",
    "lock-key": "tasks.pinned:0f478c2bd62c2e4cdb886398bd4b938348182bef27bde298772c24433bf6e5d9",
    "lock-key-keywords": "tasks.pinned:b4f1a16ba4f4737d11db372995eb577b0b3d720d721687e9735cb6256f3fe206",
    "variadic": "tasks.pinned:5f67308fa889ee0b1b2c62e48bacdc597c999ccdbcc176fbdc20fdc9a8147855",
    "variadic-lock-on": "tasks.pinned:db60acd962bff486fd9d91a364ed97b6a7c86a5119238f885af5cea43c9be526",
    "variadic-lock-on-two": "tasks.pinned:b99d9e64d9fb79c470bc3a7bb2df32625b4e4dd02e59aac6db7271ae223f1b4b",
    "keyword-only": "tasks.pinned:0ece9c5edda8b582c558275d247f5a9c1043de430d0b38504b9fb2c7315dcd3e",
    "keyword-only-default": "tasks.pinned:5fa2d07f684f15944c6f082ea161a7655fd8abee7d8b24a152c431c5639ea54d",
    "positional-only": "tasks.pinned:016b85da120364e23d612c99e64f65c0f869828a7c7d27bbff40d2323902143d",
    "skip-first": "tasks.pinned:8d408a29a0b4bd9970d1e7f1fd8a21763f9980f3205442178a671e3f0da72135",
    "self": "tasks.pinned:837c3565f2ab96efe72c3c7a8fdc510e804c6afa64343898ba94e34ae463ae07",
    "no-parameters": "tasks.pinned:463ac82bf3e3869694a2886a25e0c746323709a9dd2320843e3b8b56d7137c35",
    "namespace": "staging_tasks.pinned:0abafc1d0dbb2a96f5716bd56edf86d2c9c3d8928453294b54fec84ea9d7f142",
    "too-many-arguments": refused(
        LockKeyError, "task tasks.pinned: arguments do not match its signature"
    ),
    "missing-argument": refused(
        LockKeyError, "task tasks.pinned: arguments do not match its signature"
    ),
    "unknown-keyword": refused(
        LockKeyError, "task tasks.pinned: arguments do not match its signature"
    ),
    "positional-only-by-keyword": refused(
        LockKeyError, "task tasks.pinned: arguments do not match its signature"
    ),
    "unsupported": refused(
        UnsupportedArgumentError,
        f"task tasks.pinned: argument x has type builtins.set, {NO_ENCODING}",
    ),
    "unsupported-nested": refused(
        UnsupportedArgumentError,
        f"task tasks.pinned: argument x['a'][1] has type tests.unit.test_argument_names_pinned.Unsupported, {NO_ENCODING}",
    ),
    "unsupported-key": refused(
        UnsupportedArgumentError,
        f"task tasks.pinned: argument x key frozenset() has type builtins.frozenset, {NO_ENCODING}",
    ),
    "unsupported-not-in-lock-on": "tasks.pinned:ed426de25411c90e5c4daea81b33603a71662cd7e460e2aedc61cdf50d697224",
    "unsupported-in-lock-on": refused(
        UnsupportedArgumentError,
        f"task tasks.pinned: argument amount has type datetime.timedelta, {NO_ENCODING}",
    ),
}


@pytest.mark.parametrize(
    ("func", "options", "args", "kwargs", "expected"),
    [(*call, EXPECTED[key]) for key, call in CALLS.items()],
    ids=CALLS.keys(),
)
def test_name_is_the_one_the_first_release_computed(
    func: Callable[..., Any], options: dict[str, Any], args: Any, kwargs: Any, expected: Expected
) -> None:
    keyer = ArgumentKeyer(NAME, func, **options)
    if isinstance(expected, str):
        assert keyer.name(args, kwargs) == expected
        return
    error, message = expected
    with pytest.raises(LockKeyError) as raised:
        keyer.name(args, kwargs)
    assert type(raised.value) is error
    assert str(raised.value).startswith(message), str(raised.value)


def test_every_call_has_its_expected_name() -> None:
    assert CALLS.keys() == EXPECTED.keys()


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


def test_the_group_digest_format_is_stable_across_releases() -> None:
    # A lock_group's name hashes ["lock_group", group] where a task's hashes its name: pinned
    # like the task's, so that workers of two versions name a group's lock alike.
    expected = "3f4931340b7c2da1cca9e0ea8494be73d5c1eaa2276bdeb253a35ff532c682b8"
    assert canonical_digest("tasks.t", {"tenant": "t1"}, group="api") == expected


def test_the_name_of_an_empty_lock_on_is_stable_across_releases() -> None:
    def charge(tenant: str, amount: int) -> None: ...

    keyer = ArgumentKeyer("tasks.t", charge, group="api", lock_on=())
    expected = "api:cbcfd87339e75c5f9ed0295d7ae1562bd96fdfe9300840e7f569953fa07efa8f"
    assert keyer.name(("t1", 5), {}) == expected
