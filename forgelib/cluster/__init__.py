"""``forge run --cluster ADDRESS``: the same trials on a Ray cluster, one Docker engine per node.

Ray is an optional extra (``pip install 'forgelib[ray]'``) and is imported only here, only under
``--cluster``: ``import forgelib.cluster`` itself imports no Ray (``connect`` does). The pieces:

* ``bundle`` — the project shipped to a node by content, seed digests re-verified there;
* ``node`` — what runs on a node: the local ``Executor.run_trial`` against the node's own engine;
* ``driver`` — the ``forge run`` side: places trials, appends every event, brings the files back,
  reruns a trial once when its node is lost, and stops every node's stacks on Ctrl-C;
* ``connect`` — joining the cluster (and the loopback shim a one-machine cluster needs).
"""

# A node offers this custom resource (``ray start --resources '{"forge_docker": SLOTS}'``): Ray places a
# trial only on a node that has it, and at most SLOTS trials on that node at once.
RESOURCE = "forge_docker"
# The engine a node serves, read by forge on the node (set in the environment of its ``ray start``): a
# node's DOCKER_HOST is whatever its shell had, so forge wants the choice made on purpose.
ENGINE_ENV = "FORGE_DOCKER_HOST"

__all__ = ["ENGINE_ENV", "RESOURCE"]
