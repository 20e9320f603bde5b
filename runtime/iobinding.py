"""I/O binding: run a session on memory the caller or the runtime keeps between runs.

Shaped like onnxruntime's ``IOBinding``, for CPU memory::

    b = sess.io_binding()
    b.bind_input("input_ids", ids)            # read in place when contiguous and as aligned
                                              # as the graph's input "align" (element size)
    b.bind_output("logits")                   # runtime-owned memory, sized for the dims' max
    b.bind_output("present.0.key", array)     # or the caller's memory (enough bytes)
    sess.run_with_iobinding(b)
    b.get_outputs()                           # views on the bound memory (no copy)
    b.copy_outputs_to_cpu()                   # fresh copies

What it is for: decoding with a key/value cache.  ``present.i.key`` of one step is the
next step's ``past_key_values.i.key``; bind the view ``get_outputs()`` returned as the
next input and the kernels read it where the previous step wrote it: no whole-cache copy
into the arena or out of it.  Each runtime-owned output has two buffers, each of the
output's size at the dims' maxima, used in turn: a run never writes the buffer an input it
reads lies in, and an output view stays valid through the next run of the same binding
(it is overwritten by the run after that; an input is recognised as lying in an owned
buffer through numpy's ``base`` chain, i.e. when it is a numpy view of a returned output).
Memory of the caller's (``bind_output(name,
array)``) is the caller's to manage: it may not overlap a bound input.

An input array is read when the run happens, not when it is bound (as onnxruntime's
``bind_cpu_input`` reads the array it was given).  Unbound outputs are computed but not
returned; with no output bound, every output is bound to runtime-owned memory.  A binding
is for one thread at a time.  Nothing here imports the compiler.
"""

from __future__ import annotations

import numpy as np

__all__ = ["IOBinding"]


def _aligned_bytes(nbytes: int, alignment: int = 64) -> np.ndarray:
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    start = (-raw.ctypes.data) % alignment
    return raw[start:start + nbytes]


def _root(a: np.ndarray) -> np.ndarray:
    """The array owning ``a``'s memory (the end of its ``base`` chain)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


class IOBinding:
    """Inputs and outputs bound for :meth:`runtime.Session.run_with_iobinding`.

    Made by :meth:`runtime.Session.io_binding`.  See the module docstring for the rules on
    memory and lifetimes.
    """

    def __init__(self, session):
        self._session = session
        self._inputs: dict = {}
        self._outputs: dict = {}  # name -> caller's uint8 memory, or None (runtime-owned)
        self._owned: dict = {}  # name -> [two aligned uint8 buffers]
        self._last: dict = {}  # name -> index of the owned buffer written last
        self._results: list | None = None
        self._dtypes = {a.name: a for a in session.get_outputs()}
        self._input_names = [a.name for a in session.get_inputs()]

    # -- binding ---------------------------------------------------------------------
    def bind_input(self, name: str, array: np.ndarray) -> None:
        """Bind input ``name`` to ``array`` (read at each run; shape and dtype are checked
        then, as ``Session.run`` checks a feed)."""
        if name not in self._input_names:
            raise ValueError(f"bind_input: unknown input {name!r}; the model's inputs are "
                             f"{self._input_names}")
        if not isinstance(array, np.ndarray):
            raise ValueError(f"bind_input({name!r}): expected a numpy array, got "
                             f"{type(array).__name__}")
        self._inputs[name] = array

    def bind_output(self, name: str, array: np.ndarray | None = None) -> None:
        """Bind output ``name`` to runtime-owned memory (``array`` None), or to ``array``:
        C-contiguous, writable, of the output's dtype, with at least as many bytes as the
        output takes at the run (its shape is then the run's, on that memory)."""
        if name not in self._dtypes:
            raise ValueError(f"bind_output: unknown output {name!r}; the model's outputs "
                             f"are {list(self._dtypes)}")
        if array is None:
            self._outputs[name] = None
            return
        want = self._dtypes[name]
        if not isinstance(array, np.ndarray):
            raise ValueError(f"bind_output({name!r}): expected a numpy array or None, got "
                             f"{type(array).__name__}")
        if array.dtype.name != want.dtype:
            raise ValueError(f"bind_output({name!r}): the output is {want.type}, the array "
                             f"is {array.dtype.name}")
        if not (array.flags.c_contiguous and array.flags.writeable):
            raise ValueError(f"bind_output({name!r}): the array must be C-contiguous and "
                             "writable")
        self._outputs[name] = array.reshape(-1).view(np.uint8)
        self._owned.pop(name, None)

    def clear_binding_inputs(self) -> None:
        self._inputs.clear()

    def clear_binding_outputs(self) -> None:
        self._outputs.clear()
        self._owned.clear()
        self._last.clear()
        self._results = None

    # -- results ---------------------------------------------------------------------
    def get_outputs(self) -> list[np.ndarray]:
        """The last run's outputs, in the order they were bound: views on the bound
        memory (a runtime-owned one stays valid through the binding's next run)."""
        if self._results is None:
            raise RuntimeError("no results yet: call session.run_with_iobinding(binding)")
        return list(self._results)

    def copy_outputs_to_cpu(self) -> list[np.ndarray]:
        """The last run's outputs as fresh arrays."""
        return [a.copy() for a in self.get_outputs()]

    # -- used by Session.run_with_iobinding ----------------------------------------------
    def _prepare_run(self, arrays: dict, binding: dict) -> tuple[list, dict]:
        """(output names, {name: uint8 memory to write}) for a run reading ``arrays``."""
        sess = self._session
        if not self._outputs:
            for a in sess.get_outputs():
                self._outputs[a.name] = None
        inputs = {id(_root(a)) for a in arrays.values()}  # the memory the run reads
        memory = {}
        for name, raw in self._outputs.items():
            need = sess.output_bytes(name, binding)
            if raw is not None:
                if raw.nbytes < need:
                    raise ValueError(f"bind_output({name!r}): the bound array has "
                                     f"{raw.nbytes} bytes, this run's output needs {need} "
                                     f"(dims {binding})")
                clash = [n for n, a in arrays.items() if np.may_share_memory(raw, a)]
                if clash:
                    raise ValueError(f"bind_output({name!r}): the bound array overlaps "
                                     f"input {clash[0]!r}; kernels would overwrite what they "
                                     "read. Bind the output to other memory")
                memory[name] = raw
                continue
            past = sess._kv.get(name, (None,))[0]
            memory[name] = self._owned_buffer(name, inputs, need,
                                              None if past is None else id(_root(arrays[past])))
        return list(self._outputs), memory

    def _owned_buffer(self, name: str, inputs: set, need: int, past=None) -> np.ndarray:
        """The runtime-owned buffer to write ``name`` into: the one not written last,
        unless an input lies in it (then the other).  ``inputs``: ids of the inputs' root
        arrays (each owned buffer is a slice of an allocation of its own).  A key/value
        cache appended in place (``past``: the id of its past input's root array) is
        written into the buffer its past lies in: only the new rows are written there."""
        bufs = self._owned.get(name)
        if bufs is None or bufs[0].nbytes < need:
            at_max = {d["name"]: d["max"] for d in self._session.dims}
            size = max(need, self._session.output_bytes(name, at_max))
            bufs = self._owned[name] = [_aligned_bytes(size), _aligned_bytes(size)]
            self._last[name] = 1
        for k in (0, 1):
            if past is not None and id(bufs[k].base) == past:
                self._last[name] = k
                return bufs[k]
        order = (1 - self._last[name], self._last[name])
        for k in order:
            if id(bufs[k].base) not in inputs:
                self._last[name] = k
                return bufs[k]
        raise ValueError(f"output {name!r}: both of its runtime-owned buffers hold bound "
                         "inputs; bind an input from another binding's outputs, or a copy")

    def _set_results(self, results: list) -> None:
        self._results = results
