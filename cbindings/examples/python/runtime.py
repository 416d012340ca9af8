#!/usr/bin/env python3
"""A Python function runtime on smore through ctypes (no build step, no third-party packages).

Usage: runtime.py LIBSMORE_SO [SOCKET] [REQUESTS]

Registers with the arbiter, serves REQUESTS simulated requests — each asks for admission, runs,
and reports its latency — then polls prewarm hints. Prints one `key=value` line per step;
exits non-zero on any failure. Run by cbindings/tests/examples.rs in CI.
"""
import ctypes
import sys
import time


class Grant(ctypes.Structure):
    _fields_ = [("instance", ctypes.c_uint64), ("gpu_index", ctypes.c_uint32),
                ("sm_share", ctypes.c_uint32), ("memory_cap", ctypes.c_uint64)]


class Admission(ctypes.Structure):
    _fields_ = [("admitted", ctypes.c_int32), ("predicted_train", ctypes.c_double),
                ("predicted_fn", ctypes.c_double)]


class Hint(ctypes.Structure):
    _fields_ = [("function", ctypes.c_char * 64), ("action", ctypes.c_int),
                ("forecast_rpm", ctypes.c_double)]


OK = 0


class Smore:
    """Thin wrapper: every call raises with the library's message on failure."""

    def __init__(self, lib_path, socket=None):
        self.lib = ctypes.CDLL(lib_path)
        self.lib.smore_last_error.restype = ctypes.c_char_p
        self.lib.smore_connect.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
        self.lib.smore_register.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                            ctypes.c_double, ctypes.c_uint64, ctypes.POINTER(Grant)]
        self.lib.smore_request_begin.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)]
        self.lib.smore_request_end.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
        self.lib.smore_admit.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.POINTER(Admission)]
        self.lib.smore_flush.argtypes = [ctypes.c_void_p]
        self.lib.smore_poll_hints.argtypes = [ctypes.c_void_p, ctypes.POINTER(Hint), ctypes.c_size_t,
                                              ctypes.POINTER(ctypes.c_size_t)]
        self.lib.smore_disconnect.argtypes = [ctypes.c_void_p]
        self.handle = ctypes.c_void_p()
        self._check(self.lib.smore_connect(socket.encode() if socket else None,
                                           ctypes.byref(self.handle)), "connect")

    def _check(self, status, what):
        if status != OK:
            raise RuntimeError(f"smore {what} failed ({status}): "
                               f"{self.lib.smore_last_error().decode()}")

    def register(self, function, model, slo_ms, memory_bytes):
        g = Grant()
        self._check(self.lib.smore_register(self.handle, function.encode(), model.encode(),
                                            slo_ms, memory_bytes, ctypes.byref(g)), "register")
        return g

    def serve(self, work):
        rid = ctypes.c_uint64()
        self._check(self.lib.smore_request_begin(self.handle, ctypes.byref(rid)), "request_begin")
        adm = Admission()
        self._check(self.lib.smore_admit(self.handle, rid, ctypes.byref(adm)), "admit")
        work()
        self._check(self.lib.smore_request_end(self.handle, rid), "request_end")
        return bool(adm.admitted)

    def hints(self):
        buf = (Hint * 16)()
        n = ctypes.c_size_t()
        self._check(self.lib.smore_poll_hints(self.handle, buf, 16, ctypes.byref(n)), "poll_hints")
        return [(h.function.decode(), h.action, h.forecast_rpm) for h in buf[:n.value]]

    def close(self):
        self._check(self.lib.smore_flush(self.handle), "flush")
        self.lib.smore_disconnect(self.handle)


def main():
    lib = sys.argv[1]
    socket = sys.argv[2] if len(sys.argv) > 2 else None
    requests = int(sys.argv[3]) if len(sys.argv) > 3 else 50
    s = Smore(lib, socket)
    g = s.register("py-runtime", "bert", 80.0, 128 << 20)
    print(f"op=granted instance={g.instance} gpu={g.gpu_index} share={g.sm_share} cap={g.memory_cap}")
    admitted = sum(s.serve(lambda: time.sleep(0.0005)) for _ in range(requests))
    hints = s.hints()
    s.close()
    print(f"op=served requests={requests} admitted={admitted} hints={len(hints)}")


if __name__ == "__main__":
    main()
