"""Imported first by the fork server that ``pipeline run`` starts for a local cluster's workers
(:func:`pipeline.exec.prefork.start`), and by nothing else.

The server imports what a worker needs, then forks a worker for each request of a nanny. Python's
cyclic garbage collector walks every object it tracks at each full collection, and what a worker
inherits is tracked in it as well. Here, as Python's documentation of ``gc.freeze`` advises for a
process that forks without exec: the collector is off in the server (its full collections walked
the objects of its imports: 0.10-0.17 s of a 2.4 s preload on the H200 machine), what the server
holds is frozen before each fork, and the collector is back on in the worker, where its first full
collection walks only the worker's own objects (it had walked the server's, 0.13 s right after the
fork, before the worker joined its scheduler) and leaves the pages it shares with the server
uncopied.
"""

import gc
import os

gc.disable()
os.register_at_fork(before=gc.freeze, after_in_child=gc.enable)
