"""Calling compiled functions of one signature again and again without the CuTe DSL's per-call marshalling.

A compiled function takes each argument as the address of a C value: a pointer, an integer, a tensor's memref
descriptor. Its Python call builds those values and that list of addresses through the DSL's generic argument
path on every call, 10-30 us of host time (docs/host-cost.md). A projection calls the kernels of one signature
with new addresses and extents each time: ``CallSlots`` keeps one C value per argument and the list of their
addresses, and a launch writes the new values and hands the list to the function's ``run_compiled_program``.

Each compiled function's first launch goes through its own Python call instead, and checks that the DSL passed
the same values in the same places as the slots would: a DSL whose convention differs raises there, before any
launch through the slots.
"""

import ctypes


class CallSlots:
    """C values for the arguments of compiled functions of one signature, reused launch after launch."""

    def __init__(self, fixed, kinds):
        """``fixed``: the leading arguments, the same in every launch (CuTe tensors made once, kept alive here, or
        None); ``kinds``: one ctypes type per argument after them (``c_void_p`` for a pointer or a stream,
        ``c_int32``, ``c_int64``), None for one that is always None."""
        self._fixed = fixed
        self._values = [None if kind is None else kind() for kind in kinds]
        # A tensor is its descriptor's address; None takes no place at all.
        self._addresses = [(address, None) for argument in fixed if argument is not None
                           for address in argument.__c_pointers__()]
        self._addresses += [(ctypes.addressof(value), ctypes.sizeof(value)) for value in self._values
                            if value is not None]
        self.addresses = [address for address, _ in self._addresses]
        self._checked = set()  # the compiled functions whose first launch matched the slots

    def launch(self, code, values, arguments):
        """Launch ``code`` with ``values`` (one per kind, None where the kind is None); ``arguments()`` gives the
        whole argument list in the DSL's own types, used only at ``code``'s first launch."""
        for slot, value in zip(self._values, values):
            if slot is not None:
                slot.value = value
        if id(code) in self._checked:
            code.run_compiled_program(self.addresses)
            return
        dsl_arguments = arguments()
        self.check(code, dsl_arguments)
        code(*dsl_arguments)
        self._checked.add(id(code))

    def check(self, code, dsl_arguments):
        """Raise a RuntimeError unless ``code``'s DSL passes ``dsl_arguments`` as the slots now hold them."""
        passed, _adapted = code.generate_execution_args(*dsl_arguments)  # _adapted keeps the DSL's values alive
        passed = [address.value if isinstance(address, ctypes.c_void_p) else address for address in passed]
        same = len(passed) == len(self._addresses) and all(
            theirs == ours if size is None else ctypes.string_at(theirs, size) == ctypes.string_at(ours, size)
            for theirs, (ours, size) in zip(passed, self._addresses))
        if not same:
            raise RuntimeError("this CuTe DSL passes a compiled function's arguments differently from "
                               "decode_projection's launch slots (runtime/call_slots.py): use the DSL version "
                               "the package pins")
