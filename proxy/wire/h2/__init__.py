"""crihook's own HTTP/2 data path: kubelet side and runtime side."""
