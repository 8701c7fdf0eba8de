"""Non-tensor values read back from a checkpoint (python/ckpt/_objects.py) when their stored
bytes are damaged or hostile: every failure is a ckpt error naming the key and the checkpoint,
chained from the original, and no pickle makes unpickling allocate more than its bound (64 x
its stored size, at least 64 KiB) or nest deep enough to crash the interpreter. The pickles are
hand-written byte strings, as a damaged or forged checkpoint would hold them."""

import collections
import os
import pickle
import struct
import subprocess
import sys
import tracemalloc

import pytest

import ckpt
from ckpt import _objects

KEY, PATH = "optim.sched", "/ckpt/step-100"
PROTO = b"\x80\x04"


def glob(module, name):
    """STACK_GLOBAL of module.name."""
    return (b"\x8c" + bytes([len(module)]) + module.encode() + b"\x8c" + bytes([len(name)]) +
            name.encode() + b"\x93")


def long1(n):
    raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


def decode(data, trusted=False):
    return _objects.decode(data, KEY, None, trusted, path=PATH)


def refused(data, cls=ckpt.DataLoss, trusted=False):
    """The ckpt error decoding `data` raises, with the peak of traced allocations meanwhile."""
    tracemalloc.start()
    try:
        with pytest.raises(cls) as info:
            decode(data, trusted)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    error = info.value
    assert error.key == KEY and KEY in str(error) and PATH in str(error), str(error)
    return error, peak


VALUES = [
    0, -7, 2**80, 1.5, complex(1, -2), "text", b"\x00\xff", bytearray(b"ab"), None, True,
    [1, [2, [3]]], (1, (2, 3)), {1, 2}, frozenset({3}), {"lr": 0.1, "betas": (0.9, 0.99)},
    range(0, 10**12, 3), slice(1, None, 2), collections.OrderedDict(a=1, b=[2]),
    collections.defaultdict(list, a=[1]), collections.deque([1, [2]], maxlen=5),
    [(i, str(i)) for i in range(3000)],  # more tuples than MAX_NESTING: the guarded reader
    list(range(100000)),
]


@pytest.mark.parametrize("trusted", [False, True])
def test_plain_values_round_trip(trusted):
    for value in VALUES:
        data, digest = _objects.encode(value)
        back = _objects.decode(data, KEY, digest, trusted)
        assert back == value and type(back) is type(value), value
    back = _objects.decode(_objects.encode(VALUES[18])[0], KEY, None, trusted)
    assert back.default_factory is list


GOOD = pickle.dumps({"a": [1, 2, 3], "od": collections.OrderedDict(x=(1.5, "y" * 40)),
                     "s": {4, 5}}, protocol=4)


def test_every_truncation_is_data_loss_naming_the_key_and_chained():
    for n in range(len(GOOD) - 1):  # the last byte is STOP: without it nothing ends
        error, _ = refused(GOOD[:n])
        assert error.__cause__ is not None


def test_every_byte_flip_decodes_or_raises_a_ckpt_error_naming_the_key():
    for i in range(len(GOOD)):
        for mask in (0x01, 0x80, 0xFF):
            data = bytearray(GOOD)
            data[i] ^= mask
            try:
                decode(bytes(data))  # a flip inside a number or string is still a pickle
            except ckpt.Error as e:
                assert e.key == KEY and KEY in str(e) and PATH in str(e), (i, mask, str(e))


def test_damaged_pickles_name_what_is_wrong():
    error, _ = refused(PROTO + b"K\x01\xff.")
    assert "byte 4 (0xff) is not a pickle opcode" in str(error)
    error, _ = refused(PROTO + b"]\x94K\x01a")
    assert "no STOP" in str(error)
    error, _ = refused(PROTO + b"h\x05.")  # a memo entry never stored
    assert "does not unpickle" in str(error) and "Error" in str(error)
    error, _ = refused(PROTO + glob("builtins", "complex") + b"\x8c\x01x\x85R.")
    assert "ValueError" in str(error) and isinstance(error.__cause__, ValueError)


def test_trusted_values_raise_ckpt_errors_too():
    error, _ = refused(GOOD[:20], trusted=True)
    assert error.__cause__ is not None
    error, _ = refused(PROTO + glob("no_such_module_here", "Thing") + b")R.",
                       cls=ckpt.FailedPrecondition, trusted=True)
    assert "no_such_module_here.Thing" in str(error)


def test_globals_outside_plain_data_stay_permission_denied_naming_the_checkpoint():
    error, _ = refused(PROTO + glob("os", "system") + b"\x8c\x02id\x85R.",
                       cls=ckpt.PermissionDenied)
    assert "os.system" in str(error)


MIB = 1 << 20
AMPLIFIERS = {
    # Calls of allowed classes that take sizes.
    "bytearray(n)": PROTO + glob("builtins", "bytearray") + long1(256 * MIB) + b"\x85R.",
    "bytes(n)": PROTO + glob("builtins", "bytes") + long1(256 * MIB) + b"\x85R.",
    "list(range(n))": PROTO + glob("builtins", "list") + glob("builtins", "range") +
                      long1(5_000_000) + b"\x85R\x85R.",
    "tuple.__new__(tuple, range(n))": PROTO + glob("builtins", "tuple") +
                                      glob("builtins", "range") + long1(5_000_000) +
                                      b"\x85R\x85\x81.",
    "a_list[:] = range(n)": PROTO + b"]" + glob("builtins", "slice") + b"N\x85R" +
                            glob("builtins", "range") + long1(5_000_000) + b"\x85Rs.",
    # list(s) of one 2000-byte string, 30000 times: each call small, all 480 MB of pointers.
    "list(s) again and again": PROTO + glob("builtins", "list") + b"\x94X" +
                               struct.pack("<I", 2000) + b"s" * 2000 + b"\x94" +
                               b"h\x00h\x01\x85R" * 30000 + b".",
    # str() of 20 tuples each holding the previous one twice: 2**20 times the text.
    "str(shared nesting)": PROTO + glob("builtins", "str") + b"\x8c\x01x\x940" +
                           b"".join(bytes([0x68, i, 0x68, i, 0x86, 0x94, 0x30])
                                    for i in range(20)) + b"h\x14\x85R.",
    # Lengths the C unpickler allocates before it reads.
    "BINBYTES8 length": PROTO + b"\x8e" + struct.pack("<Q", 1 << 30) + b"ab.",
    "BYTEARRAY8 length": b"\x80\x05\x96" + struct.pack("<Q", 1 << 30) + b"ab.",
    "BINBYTES length": PROTO + b"B" + struct.pack("<I", 1 << 30) + b"ab.",
    "memo index": PROTO + b"N" + b"r" + struct.pack("<I", 1 << 24) + b".",
}


@pytest.mark.parametrize("name", sorted(AMPLIFIERS))
def test_amplifying_pickles_are_refused_before_they_allocate(name):
    data = AMPLIFIERS[name]
    error, peak = refused(data)
    assert peak < 4 * MIB, f"{name}: {peak} bytes traced"
    assert "refused" in str(error), str(error)


def test_calls_may_build_up_to_64_times_the_stored_size():
    def bytearray_of(n):
        return PROTO + glob("builtins", "bytearray") + long1(n) + b"\x85R."

    assert len(decode(bytearray_of(60_000))) == 60_000  # under the 64 KiB floor
    refused(bytearray_of(70_000))
    padding = b"\x8c\xff" + b"p" * 255 + b"0"  # a string pushed and dropped: stored bytes
    big = PROTO + padding * 40 + glob("builtins", "bytearray") + long1(600_000) + b"\x85R."
    assert len(big) * _objects.BUDGET_FACTOR > 600_000 + 64
    assert len(decode(big)) == 600_000


DEEP = 300_000
CRASHERS = {
    # Hashing a tuple recurses into its tuples without a limit: a key this deep crashes.
    "a deep tuple as a dict key": PROTO + b"})" + b"\x85" * DEEP + b"K\x01s.",
    "a deep MARK-built tuple in a set": PROTO + b"\x8f(" + b"(" * DEEP + b"t" * DEEP +
                                        b"\x90.",
    # Freeing a deque inside a deque ... recurses without the trashcan: deque((deque(...),)).
    "deques inside deques": PROTO + glob("collections", "deque") + b"\x94" +
                            b"h\x00" * DEEP + b")\x85R" + b"\x85\x85R" * DEEP + b".",
}


@pytest.mark.parametrize("name", sorted(CRASHERS))
def test_nesting_that_would_crash_the_interpreter_is_refused(name, tmp_path):
    # In a child process: on code without the bound it dies of a signal, not of an assertion.
    path = tmp_path / "value.pickle"
    path.write_bytes(CRASHERS[name])
    script = (
        "import sys, ckpt\n"
        "from ckpt import _objects\n"
        f"data = open({str(path)!r}, 'rb').read()\n"
        "try:\n"
        f"    _objects.decode(data, {KEY!r}, None, False)\n"
        "except ckpt.DataLoss as e:\n"
        "    print('DataLoss', e)\n"
        "    sys.exit(0)\n"
        "sys.exit('decoded')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=300,
                          env=dict(os.environ))
    assert done.returncode == 0, (done.returncode, done.stderr.decode()[-2000:])
    out = done.stdout.decode()
    assert KEY in out and ("deeper than" in out or "directly inside" in out), out
