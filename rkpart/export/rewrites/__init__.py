"""The rewrites :mod:`rkpart.export.patches` registers, by kind.

Each function rewrites an eval-mode diffusers module in place into an exportable form of the same
function: ``fn(model, inputs, fixed)``, where ``inputs`` are the graph inputs by name and ``fixed``
the keyword arguments of ``forward`` fixed at export time (both may be updated: a list input
becomes several tensors, a table computed once moves into ``fixed``).  torch and diffusers are
imported inside the functions, so importing this package needs neither.

- :mod:`.rope`: complex RoPE rewritten to the real (cos/sin) form, RoPE tables computed once for
  the static shapes;
- :mod:`.attention`: sparse, mixture-of-experts and grouped-query attention in dense forms;
- :mod:`.signature`: adapters that give ``forward`` tensor inputs where diffusers takes lists,
  caches or dicts;
- :mod:`.graph`: single ops neither exporter converts (boolean-mask writes, QR, ``rms_norm``).
"""
