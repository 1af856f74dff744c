"""The RoPE-allocation tools as commands: ``repro profile``, ``allocate``, ``transfer``,
``account`` and ``analyze`` (the science they call is ``repro.alloc``)."""
