"""The board bundle: ``rkpart bundle`` (:mod:`rkpart.bundle.build`) and its standalone runner.

:mod:`rkpart.bundle.runner` imports nothing from rkpart (it is copied into every bundle), so
this package's ``__init__`` stays empty: importing the runner must not pull in the builder.
"""
