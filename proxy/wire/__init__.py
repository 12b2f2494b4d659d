"""Transports: the only place for grpc.aio servers and crihook's own HTTP/2."""
