"""Calling compiled functions of one signature again and again without the CuTe DSL's per-call marshalling.

A compiled function takes each argument as the address of a C value: a pointer, an integer, a float, a
tensor's memref descriptor. Its Python call builds those values and that list of addresses through the DSL's
generic argument path on every call, most of an eager projection's or glue op's host time (docs/host-cost.md).
A projection, and each glue kernel (kernel/rowwise.py), calls kernels of one signature with new addresses and
extents each time: ``CallSlots`` keeps one C value per argument and the list of their addresses, and a launch
writes the new values and hands the list to the function's ``run_compiled_program``, the method its Python call
ends in (which also loads the module on first use).

Each compiled function's first launch goes through its own Python call instead, and checks that the DSL passed
the values the slots hold in the same places: a DSL whose convention differs raises there, before any launch
through the slots. (It cannot tell a position from another holding an equal value; the CPU tests check the
order with distinct values.)
"""

import ctypes


class CallSlots:
    """C values for the arguments of compiled functions of one signature, reused launch after launch."""

    def __init__(self, fixed, kinds):
        """``fixed``: the leading arguments, the same in every launch (CuTe tensors made once, kept alive here, or
        None); ``kinds``: one ctypes type per argument after them (``c_void_p`` for a pointer or a stream,
        ``c_int32``, ``c_int64``, ``c_float``), None for one that is always None."""
        self._fixed = fixed
        self._values = [None if kind is None else kind() for kind in kinds]
        # (address, bytes to compare): a tensor is its descriptor's address, compared as such; None takes no place.
        self._places = [(address, None) for argument in fixed if argument is not None
                        for address in argument.__c_pointers__()]
        self._places += [(ctypes.addressof(value), ctypes.sizeof(value)) for value in self._values
                         if value is not None]
        self.addresses = [address for address, _ in self._places]
        # The compiled functions whose first launch matched the slots, by id (each kept, so its id stays its own).
        self._checked = {}

    def write(self, values):
        """Hold ``values``, one per kind (None where the kind is None)."""
        for slot, value in zip(self._values, values, strict=True):
            if slot is not None:
                slot.value = value

    def launch(self, code, values, arguments):
        """Launch ``code`` with ``values``; ``arguments()`` gives the whole argument list in the DSL's own types,
        used only at ``code``'s first launch."""
        self.write(values)
        if self._checked.get(id(code)) is code:
            code.run_compiled_program(self.addresses)
            return
        dsl_arguments = arguments()
        self.check(code, dsl_arguments)
        code(*dsl_arguments)
        self._checked[id(code)] = code

    def check(self, code, dsl_arguments):
        """Raise a RuntimeError unless ``code``'s DSL passes ``dsl_arguments`` as the slots now hold them."""
        # The DSL's C values live as long as the list it returns (and the adapted arguments) do.
        passed, adapted = code.generate_execution_args(*dsl_arguments)
        addresses = [address.value if isinstance(address, ctypes.c_void_p) else address for address in passed]
        same = len(addresses) == len(self._places) and all(
            isinstance(theirs, int) and theirs != 0
            and (theirs == ours if size is None else ctypes.string_at(theirs, size) == ctypes.string_at(ours, size))
            for theirs, (ours, size) in zip(addresses, self._places))
        del passed, adapted
        if not same:
            raise RuntimeError("this CuTe DSL passes a compiled function's arguments differently from "
                               "decode_projection's launch slots (runtime/call_slots.py): use the DSL version "
                               "the package pins")
