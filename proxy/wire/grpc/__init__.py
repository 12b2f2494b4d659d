"""The grpc.aio data path: server, pass-through and the runtime client."""
