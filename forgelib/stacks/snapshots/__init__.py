"""Golden snapshots: a reset service's state right after its first successful seeding, captured once as a
labelled Docker image and restored into each later fresh trial before the service starts.

``key`` says which bytes a golden stands for (everything that determines them); ``store`` keeps goldens
on the engine (build, find, discard, list, locks); ``cli`` is ``forge snapshots``. What a seed kind
captures and how its restored state is checked lives in its seed module (``RECIPE_VERSION``,
``golden_path``, ``state_digest``); provisioning (``forgelib.stacks.provision``) decides when.
"""
