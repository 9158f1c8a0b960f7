"""The opening of every llama-cpp-python child script the benchmarks run (bench/scale.py,
bench/arch_crosscheck.py): those scripts run in llama.cpp's own venv (bench/.venv-llama), so they
are source strings, and this is the one copy of the part they share.

PRELUDE turns llama.cpp's model parameter use_extra_bufts off (its AMX / repacked CPU buffers
fault with SIGILL on some of these VMs) by wrapping llama_model_default_params where Llama()
reads it, in both modules that hold a reference. Builds without the field are left as they are;
`_default` stays the unwrapped function, so a script can report hasattr(_default(),
"use_extra_bufts") — whether the switch applied.
"""
import textwrap

PRELUDE = textwrap.dedent("""
    import llama_cpp
    import llama_cpp.llama as _ll
    _default = llama_cpp.llama_model_default_params
    def _params():
        p = _default()
        if hasattr(p, "use_extra_bufts"):
            p.use_extra_bufts = False
        return p
    llama_cpp.llama_model_default_params = _params
    _ll.llama_cpp.llama_model_default_params = _params
""")
