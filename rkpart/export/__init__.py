"""From a diffusers pipeline folder to what rkpart partitions (``rkpart export``).

:mod:`~rkpart.export.record` records one real call of the pipeline, :mod:`~rkpart.export.describe`
derives ``pipeline.json`` from it and checks it reproduces the call, :mod:`~rkpart.export.vae`
builds the post-loop decoder, :mod:`~rkpart.export.build` writes the export folder.  torch and
diffusers are the ``export`` extra: import these modules only from the command that needs them.
"""
