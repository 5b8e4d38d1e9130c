"""Compiler crash triage: version matrix, delta-debugging reduction, reproducer artifacts.

* :func:`rkpart.triage.repro.reproduce` - the ``rkpart repro`` pipeline (docs/triage.md)
* :func:`rkpart.triage.matrix.build_matrix` - one model x several toolkit versions
* :func:`rkpart.triage.reduce.reduce_graph` - bisect, then linear, to a minimal failing graph
* :func:`rkpart.triage.compat.check_runtime_compat` - toolkit vs board runtime warnings

Known toolkit failures are named by :func:`rkpart.targets.known_issues.match_signature` (the
table that also excludes crashing candidates before anything is built).
"""
