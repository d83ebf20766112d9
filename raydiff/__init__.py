"""raydiff: IDDPM / ADM diffusion training on Ray.

``raydiff.core`` is the pure-PyTorch diffusion core (no Ray); ``raydiff.config`` the typed
configuration. Ray is imported only by the orchestration layer.
"""

__version__ = "0.1.0"
