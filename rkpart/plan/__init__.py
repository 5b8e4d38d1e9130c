"""Write the plan: a partition as a folder of standalone stage models and ``plan.json``.

``plan.py``     :class:`Plan` / :class:`Stage`, read back with :func:`load_plan`
``schema.py``   the plan.json schema (``schema_docs.py`` writes it and the custom spec's to docs/)
``write.py``    the crash-safe, resumable writer; ``outdir.py`` what may be replaced
``extract.py``  one stage's ``.onnx`` and data file; ``weights.py`` the weight bytes (copy or link)
``verify.py``   the files a plan names, checked before use; ``anonymize.py`` a model without names

The last step of the partition flow (``ir`` -> ``discovery`` -> ``grouping`` -> ``plan``); compile,
runtime, profile and the cost model read what it wrote.
"""
