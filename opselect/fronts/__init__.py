"""One front per op: everything between torch's calling conventions and the op's dispatcher.

    fronts/<op>.py    the public function (ops.<op>), the op's one autograd.Function (backward,
                      jvp, vmap rule: the Autograd kernel of its torch.library op and the path
                      of eager calls under function transforms), its torch.library ops for
                      compiled code (schema, kernel, fake, autograd, vmap, the trace-time
                      choice), and the handlers of the torch entry points that opselect.enable()
                      takes over
    fronts/_base.py   what the fronts share (routing helpers, torch-only answers)

The machinery they use is cross-op: library.py (the library handle, the trace-time rule),
transforms.py (watched(), batching), routing.py (installing the wrappers). An op's kernels and
backends are in opselect/kernels/<op>/. A new op is one kernels/<op>/ package plus one front.
"""
