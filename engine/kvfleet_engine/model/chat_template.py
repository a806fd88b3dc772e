"""The chat template renderer lives in the contract (the router renders prompts the same way
to tokenize text for its precise prefix index); re-exported here for the engine's modules."""

from kvfleet_engine.contract.chat_template import (
    CHATML_TEMPLATE,
    ChatTemplateError,
    normalize_messages,
    render_chat,
)

__all__ = ["CHATML_TEMPLATE", "ChatTemplateError", "normalize_messages", "render_chat"]
