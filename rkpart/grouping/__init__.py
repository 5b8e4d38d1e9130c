"""Choose the groups: which ops form one stage, and on which device (the partition).

``groups.py``       :class:`Group` and :class:`Partition` (frozen), ordering, the acyclic re-cut
``strategies/``     the built-in strategies and the plugin registry (grouping only)
``views.py``        the NPU's rank-4 view rule: which tensors cross a boundary as a view, and how
``capability.py``   ops the toolkit does not run on the NPU leave NPU stages (probed through the rewrites)
``learned.py``      placements learned from earlier builds (the user cache's store)
``coverage.py``     how much of the blocks' matmul work a partition puts on the NPU
``propose.py``      the proposal loop around a strategy: a :class:`Proposal` (partition + its graph)

The third step of the flow (``ir`` -> ``discovery`` -> ``grouping`` -> ``plan``): nothing here
writes a file of the plan, and no proposal changes the graph it is given.
"""
