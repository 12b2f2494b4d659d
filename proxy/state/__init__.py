"""What crihook remembers: pods, containers, hook state, journals, reconcile."""
