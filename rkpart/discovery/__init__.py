"""Find the blocks: a loaded graph's transformer blocks and the regions inside each.

``structure.py``    the built-in analysis: residual adds, streams, branches (:class:`Discovery`)
``recognizers.py``  recognisers (plugins, the scope fallback) consulted around it: :func:`discover`

The second step of the flow (``ir`` -> ``discovery`` -> ``grouping`` -> ``plan``); it reads the
graph and proposes nothing.
"""
