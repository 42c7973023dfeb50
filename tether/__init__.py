"""tether: train the model behind an unchanged LLM agent with reinforcement learning.

The top level holds only the version; the parts are the subpackages (``tether.run``,
``tether.gateway``, ``tether.trainer``, …), each with its own face. Importing
``tether`` imports nothing else, so ``tether.__version__`` is instant.
"""

#: The release, in one place: pyproject.toml reads it ([tool.setuptools.dynamic]),
#: and the CLI's --version and the gateway's OpenAPI document show it.
__version__ = "0.1.0"
