"""Non-tensor state-dict values (ints, floats, strings, small picklable objects such as an LR
scheduler's state): pickled, stored as a 1-d uint8 tensor under their key, and read back with
an unpickler that only builds plain data unless the caller trusts the checkpoint.

Reading plain data is bounded by the stored size as well as by the allowed globals:

* the opcode stream is checked first (``_scan``): every length an opcode declares must fit in
  the bytes that follow it and every memo index must be below the stored size, because
  CPython's unpickler allocates a declared ``bytes``/``bytearray`` length and grows its memo
  to a declared index before it reads anything (a 14-byte pickle would take 1 GiB);
* a pickle that calls nothing (REDUCE, NEWOBJ, NEWOBJ_EX, INST, OBJ) then builds at most a
  constant number of bytes per stored byte (a list, set or dict per opcode), and is read by
  the C unpickler;
* one that calls an allowed class (how OrderedDict, deque, defaultdict, complex, slice, range
  and bytearray are pickled) is read by a guarded unpickler that charges every call the bytes
  it may build (``bytearray(n)``: n; ``list(range(n))``: n elements) against
  ``max(64 KiB, 64 x stored bytes)`` and refuses the value before the call that would exceed
  it, and that sets items only on dicts (``some_list[slice] = range(n)`` builds n elements).

Nesting is bounded where CPython recurses without a limit (a crash, not an exception): hashing a
tuple recurses into its tuples, and freeing a deque, slice or defaultdict recurses into what it
holds. A pickle with more than MAX_NESTING tuple opcodes goes to the guarded unpickler, which
refuses tuples (and slices) nested deeper than MAX_NESTING and a deque, slice or defaultdict
directly inside another one; pickle.dumps itself cannot write anything nested that deep.

Every failure while decoding is a ckpt.Error naming the key (and the checkpoint when known):
ckpt.DataLoss for damaged or over-budget bytes, chained from the original exception.
"""

import collections
import hashlib
import io
import pickle
import pickletools

# Globals a plain-data pickle may name: builtin containers and scalars.
_SAFE = {
    ("builtins", n)
    for n in ("set", "frozenset", "complex", "slice", "range", "bytearray", "dict", "list",
              "tuple", "int", "float", "str", "bytes", "bool")
} | {("collections", n) for n in ("OrderedDict", "defaultdict", "deque")}

#: Bytes the calls of a plain-data pickle of n stored bytes may build: max(MIN, FACTOR * n).
BUDGET_MIN = 64 << 10
BUDGET_FACTOR = 64

# Opcodes that call a global (the only way a plain-data pickle can be made to build much more
# than it stores).
_CALLS = {pickle.REDUCE[0], pickle.NEWOBJ[0], pickle.NEWOBJ_EX[0], pickle.INST[0], pickle.OBJ[0]}
_MEMO_PUTS = {pickle.PUT[0], pickle.BINPUT[0], pickle.LONG_BINPUT[0]}
_TUPLES = {pickle.TUPLE[0], pickle.TUPLE1[0], pickle.TUPLE2[0], pickle.TUPLE3[0]}

#: Deepest tuple (or slice) nesting a plain-data pickle may build.
MAX_NESTING = 1000
# Types whose deallocation recurses into their contents without CPython's trashcan.
_NO_TRASHCAN = (collections.deque, slice, collections.defaultdict)


def _opcode_table():
    """opcode byte -> (kind, n): ("fixed", bytes), ("lines", count) or ("counted", (width,
    signed)) for the argument that follows it; None for a byte that is no opcode."""
    table = [None] * 256
    counted = {pickletools.TAKEN_FROM_ARGUMENT1: (1, False),
               pickletools.TAKEN_FROM_ARGUMENT4: (4, True),
               pickletools.TAKEN_FROM_ARGUMENT4U: (4, False),
               pickletools.TAKEN_FROM_ARGUMENT8U: (8, False)}
    for op in pickletools.opcodes:
        arg = op.arg
        if arg is None:
            spec = ("fixed", 0)
        elif arg.name == "stringnl_noescape_pair":
            spec = ("lines", 2)
        elif arg.n == pickletools.UP_TO_NEWLINE:
            spec = ("lines", 1)
        elif arg.n >= 0:
            spec = ("fixed", arg.n)
        else:
            spec = ("counted", counted[arg.n])
        table[ord(op.code)] = spec
    return table


_OPCODES = _opcode_table()


class _Refused(Exception):
    """A pickle refused by the checks here (the message says why)."""


def _memo_index(code, raw):
    if code == pickle.PUT[0]:
        try:
            return int(raw)
        except ValueError:
            raise _Refused(f"memo index {raw[:20]!r} is not a number") from None
    return int.from_bytes(raw, "little")


def _scan(data):
    """True when the pickle needs the guarded unpickler: it calls a global, or builds more than
    MAX_NESTING tuples (so they could nest deeper). Raises _Refused for a byte that is no
    opcode, an argument running past the end (a declared length included), a memo index not
    below the stored size, or a stream without STOP."""
    pos, end, calls, tuples = 0, len(data), False, 0
    while pos < end:
        code, start = data[pos], pos
        spec = _OPCODES[code]
        if spec is None:
            raise _Refused(f"byte {start} (0x{code:02x}) is not a pickle opcode")
        pos += 1
        kind, n = spec
        if kind == "fixed":
            arg, pos = data[pos:pos + n], pos + n
            if pos > end:
                break
        elif kind == "lines":
            for _ in range(n):
                newline = data.find(b"\n", pos)
                if newline < 0:
                    raise _Refused(f"the argument of opcode 0x{code:02x} at byte {start} has no "
                                   "end of line")
                arg, pos = data[pos:newline], newline + 1
        else:
            width, signed = n
            length = int.from_bytes(data[pos:pos + width], "little", signed=signed)
            pos += width
            if pos > end or length < 0 or length > end - pos:
                raise _Refused(f"opcode 0x{code:02x} at byte {start} declares {length} bytes; "
                               f"{max(0, end - pos)} follow")
            pos += length
            continue
        if code in _MEMO_PUTS and _memo_index(code, arg) >= max(end, 1):
            raise _Refused(f"memo index {_memo_index(code, arg)} at byte {start} is not below "
                           f"the {end} stored bytes")
        if code in _CALLS:
            calls = True
        elif code in _TUPLES:
            tuples += 1
        elif code == pickle.STOP[0]:
            return calls or tuples > MAX_NESTING
    raise _Refused(f"the pickle is truncated: no STOP in its {end} bytes")


def _where(key, path):
    return f"state-dict value {key} in the checkpoint" + (f" {path}" if path else "")


def _refuse_global(module, name, key, path):
    from ckpt.errors import PermissionDenied

    raise PermissionDenied(
        f"{_where(key, path)} needs {module}.{name} to unpickle; only plain data is built by "
        "default (pass trust_pickles=True to load it from a checkpoint you trust)", key=key)


class _PlainUnpickler(pickle.Unpickler):
    """The C unpickler, for pickles that `_scan` found call nothing."""

    def __init__(self, data, key, path=None):
        super().__init__(io.BytesIO(data))
        self._key, self._path = key, path

    def find_class(self, module, name):
        if (module, name) in _SAFE:
            return super().find_class(module, name)
        _refuse_global(module, name, self._key, self._path)


_TEXT = (str, bytes, bytearray)
_SCALARS = (str, bytes, bytearray, int, float, complex, bool, type(None))


def _call_cost(fn, values):
    """Most bytes fn(*values) (or fn.__new__(fn, *values)) may build, None when the call is
    refused outright: str() of a container (its text can be exponentially longer than the
    pickle, through shared references)."""
    if fn is str and not all(isinstance(v, _SCALARS) for v in values):
        return None
    cost = 64
    for v in values:
        if isinstance(v, int):
            cost += max(v, 0) if fn in (bytes, bytearray) else 0
            continue
        try:
            n = len(v)
        except TypeError:
            continue
        except (OverflowError, ValueError):
            return None  # range(2**100): no size
        # Text from text: at most 4 bytes a character; anything else: a new object an element.
        cost += n * (4 if fn in (str, bytes, bytearray) and isinstance(v, _TEXT) else 128)
    return cost


def _contents(values):
    """values, and one level into each (two into pairs): what a deque, slice or defaultdict
    built from them holds."""
    for v in values:
        yield v
        if isinstance(v, dict):
            yield from v.keys()
            yield from v.values()
        elif isinstance(v, (list, tuple, set, frozenset, collections.deque)):
            for item in v:
                yield item
                if type(item) is tuple and len(item) == 2:
                    yield from item


class _GuardedUnpickler(pickle._Unpickler):
    """Python's own unpickler with every call charged against a byte budget, SETITEM(S)
    admitted on dicts only, and nesting bounded (module docstring); for pickles that `_scan`
    found call allowed classes or build many tuples."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, data, key, path, budget):
        super().__init__(io.BytesIO(data))
        self._key, self._path, self._budget, self._spent = key, path, budget, 0
        self._stored = len(data)
        self._depths = {}  # id -> (tuple or slice, its nesting), holding them so ids stay unique

    def _depth(self, value):
        hit = self._depths.get(id(value))
        return hit[1] if hit is not None and hit[0] is value else 0

    def _record(self, value):
        """value; a tuple or slice has its nesting recorded, refused over MAX_NESTING."""
        if type(value) is tuple or type(value) is slice:
            items = value if type(value) is tuple else (value.start, value.stop, value.step)
            depth = 1 + max((self._depth(i) for i in items), default=0)
            if depth > MAX_NESTING:
                raise _Refused(f"it nests tuples deeper than {MAX_NESTING} levels")
            self._depths[id(value)] = (value, depth)
        return value

    @staticmethod
    def _check_nesting(container_type, items):
        if issubclass(container_type, _NO_TRASHCAN):
            for item in items:
                if isinstance(item, _NO_TRASHCAN):
                    raise _Refused(f"it puts a {type(item).__name__} directly inside a "
                                   f"{container_type.__name__}")

    def find_class(self, module, name):
        if (module, name) in _SAFE:
            return super().find_class(module, name)
        _refuse_global(module, name, self._key, self._path)

    def _charge(self, fn, values):
        name = getattr(fn, "__name__", type(fn).__name__)
        cost = _call_cost(fn, values)
        if cost is None:
            raise _Refused(f"{name}() of {[type(v).__name__ for v in values]} is not plain data")
        self._spent += cost
        if self._spent > self._budget:
            raise _Refused(f"its calls would build more than {self._budget} bytes from "
                           f"{self._stored} stored bytes ({name}() asks for {cost}); ckpt never "
                           "stores such a pickle")

    def _check_call(self, fn, values):
        self._charge(fn, values)
        if isinstance(fn, type) and issubclass(fn, _NO_TRASHCAN):
            self._check_nesting(fn, _contents(values))

    def _call(self, fn, args):
        args = tuple(args)
        self._check_call(fn, args)
        return self._record(fn(*args))

    def load_reduce(self):
        args = self.stack.pop()
        self.stack[-1] = self._call(self.stack[-1], args)

    def load_newobj(self):
        args = self.stack.pop()
        cls = self.stack.pop()
        self._check_call(cls, tuple(args))
        self.append(self._record(cls.__new__(cls, *args)))

    def load_newobj_ex(self):
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack.pop()
        self._check_call(cls, tuple(args) + tuple(kwargs.values()))
        self.append(self._record(cls.__new__(cls, *args, **kwargs)))

    def load_tuple(self):
        items = self.pop_mark()  # before self.append is looked up: pop_mark rebinds it
        self.append(self._record(tuple(items)))

    def load_tuple1(self):
        self.stack[-1] = self._record((self.stack[-1],))

    def load_tuple2(self):
        self.stack[-2:] = [self._record((self.stack[-2], self.stack[-1]))]

    def load_tuple3(self):
        self.stack[-3:] = [self._record((self.stack[-3], self.stack[-2], self.stack[-1]))]

    def load_append(self):
        self._check_nesting(type(self.stack[-2]), (self.stack[-1],))
        super().load_append()

    def load_appends(self):
        self._check_nesting(type(self.metastack[-1][-1]), self.stack)
        super().load_appends()

    def _instantiate(self, klass, args):  # INST and OBJ
        self.append(self._call(klass, args))

    def _target_dict(self):
        target = self.stack[-1]
        if not isinstance(target, dict):
            raise _Refused(f"it sets items on a {type(target).__name__}; plain data sets items "
                           "on dicts only")
        return target

    def load_setitem(self):
        value = self.stack.pop()
        key = self.stack.pop()
        target = self._target_dict()
        self._check_nesting(type(target), (key, value))
        target[key] = value

    def load_setitems(self):
        items = self.pop_mark()
        target = self._target_dict()
        self._check_nesting(type(target), items)
        for i in range(0, len(items), 2):
            target[items[i]] = items[i + 1]

    for _opcode, _load in ((pickle.REDUCE, load_reduce), (pickle.NEWOBJ, load_newobj),
                           (pickle.NEWOBJ_EX, load_newobj_ex), (pickle.TUPLE, load_tuple),
                           (pickle.TUPLE1, load_tuple1), (pickle.TUPLE2, load_tuple2),
                           (pickle.TUPLE3, load_tuple3), (pickle.APPEND, load_append),
                           (pickle.APPENDS, load_appends), (pickle.SETITEM, load_setitem),
                           (pickle.SETITEMS, load_setitems)):
        dispatch[_opcode[0]] = _load
    del _opcode, _load


class _TrustedUnpickler(pickle.Unpickler):
    """Any global; one this program cannot import is a FailedPrecondition naming the key."""

    def __init__(self, data, key, path):
        super().__init__(io.BytesIO(data))
        self._key, self._path = key, path

    def find_class(self, module, name):
        try:
            return super().find_class(module, name)
        except (ImportError, AttributeError) as e:
            from ckpt.errors import FailedPrecondition

            raise FailedPrecondition(f"{_where(self._key, self._path)} needs {module}.{name}, "
                                     f"which this program cannot import: {e}",
                                     key=self._key) from e


def encode(value):
    """(bytes, sha256 hex) of a value."""
    data = pickle.dumps(value, protocol=4)
    return data, hashlib.sha256(data).hexdigest()


def budget(stored_bytes):
    """Bytes the calls of a plain-data pickle of `stored_bytes` may build."""
    return max(BUDGET_MIN, BUDGET_FACTOR * stored_bytes)


def _load(data, key, trusted, path):
    if trusted:
        return _TrustedUnpickler(data, key, path).load()
    if _scan(data):
        return _GuardedUnpickler(data, key, path, budget(len(data))).load()
    return _PlainUnpickler(data, key, path).load()


def decode(data, key, digest, trusted, path=None):
    """The value. Raises, naming `key` (and the checkpoint `path` when given): ckpt.DataLoss
    when the bytes do not match the recorded digest, do not unpickle, or would build more than
    `budget(len(data))` bytes through calls; ckpt.PermissionDenied for a global that is not
    plain data (unless `trusted`)."""
    from ckpt import errors

    where = _where(key, path)
    if digest is not None and hashlib.sha256(data).hexdigest() != digest:
        raise errors.DataLoss(f"{where}: its stored bytes do not match the checksum recorded at "
                              "save", key=key)
    try:
        return _load(bytes(data), key, trusted, path)
    except errors.Error:
        raise
    except _Refused as e:
        raise errors.DataLoss(f"{where}: its stored pickle ({len(data)} bytes) is refused: {e}",
                              key=key) from e
    except MemoryError as e:
        raise errors.ResourceExhausted(f"{where}: out of memory while unpickling its "
                                       f"{len(data)} stored bytes", key=key) from e
    except Exception as e:  # noqa: BLE001 (a damaged pickle raises any type)
        detail = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        raise errors.DataLoss(f"{where}: its stored pickle ({len(data)} bytes) does not "
                              f"unpickle: {detail}", key=key) from e
