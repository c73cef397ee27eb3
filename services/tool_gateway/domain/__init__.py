from services.tool_gateway.domain.commands import CallTool
from services.tool_gateway.domain.registry import (
    ToolSpec,
    current_versions,
    validate_arguments,
    validate_spec,
)

__all__ = ["CallTool", "ToolSpec", "current_versions", "validate_arguments", "validate_spec"]
