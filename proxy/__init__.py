"""The crihook proxy: kubelet-facing server, pass-through, pipeline, chain, store."""
