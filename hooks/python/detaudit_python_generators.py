"""NumPy's and Python's generators, noted as each optimizer step ends (torch 2.x's global step
post-hook): the digests of `numpy.random.get_state()` and `random.getstate()` go to the
interposer (`detaudit_note_python_generators`), and the next STEP record of the trace carries
them. torch's generators the interposer reads itself; these it cannot, so a resume that did not
restore them, or a step that drew from them otherwise in one run, can be named.

NumPy is read only once the program imported it; a compiled step (dynamo tracing the hook) is
left alone. Reading a generator's state draws nothing from it: what the program computes is
unchanged.
"""
import ctypes
import hashlib
import struct
import sys

_note = None  # the interposer's detaudit_note_python_generators
_is_compiling = None


def install():
    global _note
    try:
        _note = ctypes.CDLL(None).detaudit_note_python_generators
    except (AttributeError, OSError):
        return  # not under the interposer
    _note.argtypes = [ctypes.c_uint64, ctypes.c_uint64]
    _note.restype = None
    if "torch" in sys.modules:
        _register(sys.modules["torch"])
    else:
        from detaudit_after_import import after_import

        after_import("torch", _register)


def _register(torch):
    global _is_compiling
    post = getattr(sys.modules.get("torch.optim.optimizer"), "register_optimizer_step_post_hook",
                   None)
    if post is None:
        return  # torch 1.13: no global step hooks
    _is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    post(_step_ended)


def _step_ended(optimizer, args, kwargs):
    if _is_compiling is not None and _is_compiling():
        return
    _note(_numpy_digest(), _python_digest())


def _digest(data):
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") or 1


_MT19937_STATE_BYTES = 624 * 4 + 4  # numpy's mt19937_state_t: uint32_t key[624]; int pos


def _numpy_digest():
    # The global RandomState's MT19937 state, read in place: get_state() copies it into new
    # objects, about 100 us a step on these hosts, this about 5.
    random = getattr(sys.modules.get("numpy"), "random", None)
    if random is None:
        return 0
    try:
        address = random.mtrand._rand._bit_generator.ctypes.state_address
        return _digest(ctypes.string_at(address, _MT19937_STATE_BYTES))
    except AttributeError:  # a NumPy laid out otherwise
        pass
    try:
        _, keys, pos, has_gauss, gauss = random.get_state()
    except Exception:  # a NumPy whose legacy state reads otherwise: unknown
        return 0
    return _digest(keys.tobytes() + struct.pack("<qqd", pos, has_gauss, gauss))


def _python_digest():
    random = sys.modules.get("random")
    if random is None:
        return 0
    # hash() of ints and floats is the same in every process (str and bytes hashes are salted,
    # and None's was its address before Python 3.12: not hashed).
    version, internal, gauss = random.getstate()
    h = hash((version, internal, 0.0 if gauss is None else 1.0, gauss or 0.0))
    return (h & 0xFFFFFFFFFFFFFFFF) or 1
