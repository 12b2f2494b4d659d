"""crihook: a CRI runtime proxy for Kubernetes nodes with an ordered chain of hook plugins."""

__version__ = "0.1.0"
__all__ = ["__version__"]
