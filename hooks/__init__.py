"""crihook hooks: the hook author API (spec), built-in hooks, the remote plugin client and SDK."""
