"""One front per op: everything between torch's calling conventions and the op's dispatcher.

    fronts/<op>.py    the public function (ops.<op>), the op's one autograd.Function (backward,
                      jvp, vmap rule: the Autograd kernel of its torch.library op and the path
                      of eager calls under function transforms), its torch.library ops for
                      compiled code (schema, kernel, fake, autograd, vmap, the trace-time
                      choice), and the handlers of the torch entry points that opselect.enable()
                      takes over
    fronts/_base.py   what the fronts share (routing helpers, torch-only answers)

softmax.py serves softmax and log_softmax; matmul.py serves matmul and linear (torch.addmm's
bias-row form too), with _matmul_rules.py beside it (its route key, out=, and its Function's
gradients, tangents and vmap rules).

The machinery they use is cross-op: library.py (the library handle, the trace-time rule),
transforms.py (watched(), batching), routing.py (installing the wrappers). An op's kernels and
backends are in opselect/kernels/<op>/. A new op is one kernels/<op>/ package plus one front.
"""
