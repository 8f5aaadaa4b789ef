"""A stand-in for torch's CUDA-graph API on the CPU, so that the optimized runner's capture path
(``CudaRunner._capture``, ``_capture_prefill``, ``_warm_up``, ``_capturing``) runs in the CPU tests with the
stand-in kernels of ``_standins.py``.

It keeps what a CUDA graph means for the code that captures one:

* **A capture records, a replay repeats the record.** Inside ``torch.cuda.graph(g)`` every torch call the runner
  makes and every kernel it launches is put on ``g``'s tape with its argument tensors and its result. ``g.replay()``
  runs the tape again on those same tensors and writes each result into the tensor recorded for it. Python between
  the calls is not run again: a choice the runner makes from a step's data at capture time stays baked in, as on a
  GPU.
* **A capture cannot read the device, nor copy from the host.** ``.item()``, ``.tolist()``, ``int(t)``, ``bool(t)``,
  ``.numpy()`` and ``.cpu()`` raise inside a capture: on a GPU they synchronise, which invalidates the capture.
  ``torch.tensor``, ``torch.as_tensor`` and ``torch.from_numpy`` raise too: a step's data must reach the graph
  through its buffers, not through a copy baked in at capture.
* **A graph keeps addresses.** A replay fails if a tensor the capture read has moved (``.data =``, ``set_``); a
  tensor the runner replaces by a new one is simply not read (the record holds the old one), as on a GPU.
* **No garbage collection during a capture.** A collection can free CUDA objects and pinned buffers, which a
  capturing stream forbids, so the runner pauses the collector (``_capturing``); the stand-in fails a capture that
  begins with it running.
* A kernel is one unit. Its Python, including host reads of its own inputs, runs at each replay, as a kernel
  launched from the graph would read the tensors' contents at that time.

* **A capture runs nothing.** The calls run while they are recorded, since the runner's Python needs their results,
  but when the capture ends every tensor they were handed is put back as it was, and every tensor they made is
  filled with garbage (NaN, or -12345) until a replay writes it.

Not modelled: the graph memory pool's reuse of memory freed during a capture (the tape keeps every tensor alive),
and the ordering of streams and events (the CPU runs every call in order).
"""

from __future__ import annotations

import contextlib
import gc
import types

import torch
from torch.overrides import TorchFunctionMode

#: the calls that read a device tensor on the host: each synchronises, which a capturing stream forbids
HOST_READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__int__, torch.Tensor.__float__,
              torch.Tensor.__bool__, torch.Tensor.__index__, torch.Tensor.numpy, torch.Tensor.cpu}
#: the calls that make a device tensor from host data (a copy from pageable memory): refused in a capture too
#: (``torch.from_numpy``, which no torch-function mode sees, is wrapped by ``install``)
HOST_COPIES = {torch.tensor, torch.as_tensor}

#: the stand-in kernels (``_standins._standin_ops``): each is one recorded unit of a graph
KERNELS = ("store_kvcache", "kv_prefetch", "embedding", "embed_rmsnorm", "rmsnorm", "add_rmsnorm", "qk_norm_rope", "silu_mul",
           "paged_prefill", "split_kv_decode", "sample", "gemm", "skinny_gemm", "skinny_swiglu", "skinny_staged",
           "skinny_cluster", "skinny_wg")


class CaptureError(RuntimeError):
    """What a capturing stream would refuse (here raised at once)."""


def _tensors(obj) -> list[torch.Tensor]:
    """The tensors in a call's arguments (nested in tuples, lists and dicts)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for o in obj for t in _tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors(o)]
    return []


def _refuse_copy(name: str) -> None:
    raise CaptureError(f"{name}: a copy from host memory while a CUDA graph is being captured (the graph would keep "
                       f"the capture's values, if the capture survived it)")


def _storage(t: torch.Tensor) -> int | None:
    """The address of ``t``'s memory (None for an empty tensor, which has none)."""
    return t.untyped_storage().data_ptr() if t.numel() else None


def _garbage(t: torch.Tensor) -> None:
    """Fill ``t`` as memory nobody has written yet might be filled."""
    if t.is_floating_point():
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        t.fill_(-12345)


def _store(recorded, new) -> None:
    """Write a replayed call's result ``new`` into the result recorded at capture."""
    if isinstance(recorded, torch.Tensor):
        if recorded is new or (recorded.data_ptr() == new.data_ptr() and recorded.shape == new.shape
                               and recorded.stride() == new.stride()):
            return                                   # in place, or a view of the same memory
        recorded.copy_(new)
    elif isinstance(recorded, (tuple, list)):
        for r, n in zip(recorded, new):
            _store(r, n)


class Tape(TorchFunctionMode):
    """The record of one capture: top-level torch calls and kernel launches, in order.

    The calls run while they are recorded (the runner's Python needs their results), but on a GPU a capture runs
    nothing. So ``undo``, at the capture's end, puts every tensor that existed before the capture and was handed to
    a call back as it was before the first such call, and fills the tensors the calls made with garbage."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []
        self.in_kernel = 0                           # > 0: the stand-in's own work, passed through
        self._before: list[tuple[torch.Tensor, torch.Tensor]] = []      # (tensor, its contents before the capture)
        self._old: set[int] = set()                  # storages that existed before the capture
        self._made: set[int] = set()                 # storages the capture's calls made

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.in_kernel:
            return func(*args, **kwargs)
        if func in HOST_READS:
            raise CaptureError(f"{func.__name__}: a host read of a device tensor while a CUDA graph is being "
                               f"captured (it would synchronise and invalidate the capture)")
        if func in HOST_COPIES:
            _refuse_copy(func.__name__)
        return self.record(func, args, kwargs)

    def record(self, func, args, kwargs):
        """Run one call and put it on the tape with the addresses of the tensors it is handed (a graph keeps
        addresses, not tensors)."""
        handed = _tensors((args, kwargs))
        self.in_kernel += 1                          # (the bookkeeping's own torch calls are not the runner's)
        try:
            for t in handed:
                key = _storage(t)
                if key is not None and key not in self._made:
                    self._old.add(key)
                    self._before.append((t, t.clone()))
            out = func(*args, **kwargs)
            for t in _tensors(out):
                key = _storage(t)
                if key is not None and key not in self._old:
                    self._made.add(key)
            self.calls.append((func, args, kwargs, out, [t.data_ptr() for t in handed]))
        finally:
            self.in_kernel -= 1
        return out

    def undo(self) -> None:
        for _, _, _, out, _ in self.calls:
            for t in _tensors(out):
                if _storage(t) in self._made:
                    _garbage(t)
        for t, before in reversed(self._before):     # the earliest copy of any memory is put back last
            t.copy_(before)

    def replay(self) -> None:
        for func, args, kwargs, out, ptrs in self.calls:
            if [t.data_ptr() for t in _tensors((args, kwargs))] != ptrs:
                raise CaptureError(f"{getattr(func, '__name__', func)}: a tensor the graph reads has moved since the "
                                   f"capture (the graph would read the old address)")
            _store(out, func(*args, **kwargs))


class StandinGraphs:
    """The stand-in ``torch.cuda`` graph and stream API (installed by ``install``) and its counters."""

    def __init__(self) -> None:
        self.tape: Tape | None = None               # the capture in progress
        self.captures = self.replays = 0

    # ---------------------------------------------------------------- kernels
    def kernel(self, fn):
        """``fn`` as a kernel: inside a capture, run once and recorded as one call."""
        def launch(*args, **kwargs):
            tape = self.tape
            if tape is None:
                return fn(*args, **kwargs)
            return tape.record(fn, args, kwargs)
        return launch

    # ---------------------------------------------------------------- torch.cuda's graph API
    def cuda_graph_class(self):
        owner = self

        class CUDAGraph:
            def __init__(self, keep_graph: bool = False) -> None:
                self.tape: Tape | None = None

            def replay(self) -> None:
                if self.tape is None:
                    raise CaptureError("replay of a graph that was never captured")
                if owner.tape is not None:
                    raise CaptureError("replay inside a capture")
                self.tape.replay()
                owner.replays += 1

        return CUDAGraph

    @contextlib.contextmanager
    def graph(self, g, pool=None, stream=None):
        if self.tape is not None:
            raise CaptureError("a capture inside a capture")
        if g.tape is not None:
            raise CaptureError("a graph captured twice")
        if gc.isenabled():
            raise CaptureError("a capture with the garbage collector running (a collection inside it can free "
                               "CUDA objects, which a capturing stream forbids)")
        tape = Tape()
        self.tape = tape
        try:
            with tape:
                yield
        finally:
            self.tape = None
        tape.undo()
        g.tape = tape
        self.captures += 1


class _Stream:
    """A stream that orders nothing (the CPU runs every call in order)."""

    def __init__(self, device=None, *args, **kwargs) -> None:
        self.device = device

    def wait_stream(self, other) -> None:
        pass

    def wait_event(self, event) -> None:
        pass


def install(monkeypatch, ops_namespace: types.SimpleNamespace) -> StandinGraphs:
    """Put the stand-in graph and stream API in ``torch.cuda`` and make every stand-in kernel of ``ops_namespace``
    a recorded unit. Returns the counters."""
    sg = StandinGraphs()
    for name in KERNELS:
        monkeypatch.setattr(ops_namespace, name, sg.kernel(getattr(ops_namespace, name)))
    default = _Stream()
    from_numpy = torch.from_numpy

    def guarded_from_numpy(array):
        if sg.tape is not None and not sg.tape.in_kernel:
            _refuse_copy("from_numpy")
        return from_numpy(array)

    monkeypatch.setattr(torch, "from_numpy", guarded_from_numpy)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", sg.cuda_graph_class())
    monkeypatch.setattr(torch.cuda, "graph", sg.graph)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: object())
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: default)
    return sg
