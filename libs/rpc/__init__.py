from libs.rpc.client import channel
from libs.rpc.server import GrpcServer, PortInUse, Registration
from libs.rpc.status import error_detail, status_for

__all__ = ["GrpcServer", "PortInUse", "Registration", "channel", "error_detail", "status_for"]
