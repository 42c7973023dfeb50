"""Gateway configuration: one validated dataclass, fed by the CLI and the YAML config."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from tether.errors import UserError
from tether.records import check_role_name

from ._errors import InvalidRequest, UnknownRole

__all__ = ["DEFAULT_PORT", "GatewayConfig", "is_loopback"]

#: ``tether serve``'s port when ``gateway.port`` is not set.
DEFAULT_PORT = 8321


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass
class GatewayConfig:
    """Everything the gateway enforces.

    The caps bound what one request may ask of the engine; a request beyond a
    cap gets a 400 that names the cap, and the engine is never called.
    """

    #: Address to bind; anything but a loopback address needs an admin key.
    host: str = "127.0.0.1"
    #: None: DEFAULT_PORT (8321) for ``tether serve``, any free port for a training run's
    #: gateway (so a run never collides with a server, or another run, by default).
    port: int | None = None
    #: Key of the admin routes (create rollouts, read traces); TETHER_ADMIN_KEY, when set,
    #: wins over it. Neither on loopback: tether makes one and keeps it in a file (mode 600).
    admin_key: str | None = field(default=None, repr=False)
    #: Keys that may use record mode (POST /v1/chat/completions without a rollout), each
    #: at least 16 characters.
    record_keys: tuple[str, ...] = field(default=(), repr=False)
    #: The URL agents are told to use; default http://{host}:{port}. Set it when agents
    #: reach the gateway through another address (a pod, a proxy).
    public_url: str | None = None
    #: Let agents post their own reward (POST /rollouts/{id}/reward, TETHER_REWARD_URL);
    #: off: the route refuses them and agents are not told the URL.
    allow_agent_rewards: bool = False
    #: How tool calls are read from the model's text: hermes (<tool_call> JSON), llama3_json or none.
    tool_parser: str = "hermes"
    #: The model name /v1/models lists.
    served_model_name: str = "policy"
    #: Largest request body accepted (bytes); a larger one gets a 413.
    max_body_bytes: int = 4 * 1024 * 1024
    #: Most choices (n) one request may ask for.
    max_n: int = 16
    #: Most completion tokens (max_tokens / max_completion_tokens) one request may ask for.
    max_tokens: int = 4096
    #: Completion tokens of a request that names no max_tokens.
    default_max_tokens: int = 512
    #: Most top_logprobs one request may ask for.
    max_top_logprobs: int = 20
    #: Most messages in one request.
    max_messages: int = 512
    #: Most tools in one request.
    max_tools: int = 128
    #: The context in tokens (prompt + max_tokens) a call may use; None: the model's own
    #: (the smaller of its max_position_embeddings and its tokenizer's model_max_length).
    #: It can only lower the model's.
    max_context: int | None = None
    #: Seconds a call may wait for the engine's answer before it fails with a 504.
    engine_timeout_s: float = 300.0
    #: Seconds a call waits while admission is paused (an update) before a 503.
    admission_timeout_s: float = 600.0
    #: Log each call's prompt and completion (off: no prompt text in logs).
    log_prompts: bool = False
    #: Render and tokenize only the new turns of a rollout's conversation (tether.chat.HistoryCache).
    render_cache: bool = True
    #: The agent roles served at /rollouts/{id}/roles/{role}/v1 (each call records its
    #: role); another role gets a 404. None: any role name. A training run with a
    #: roles section serves exactly its roles.
    roles: tuple[str, ...] | None = None
    #: The engine adapter that serves each role's calls (``SamplingParams.adapter``): the
    #: role's own LoRA adapter, or ``base`` for a frozen role. A role not named here is
    #: served by the policy. A training run sets it from its roles.
    role_adapters: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("max_n", "max_tokens", "max_messages", "max_tools", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise UserError(f"gateway.{name} ({getattr(self, name)}) must be >= 1")
        if self.max_top_logprobs < 0:
            raise UserError(f"gateway.max_top_logprobs ({self.max_top_logprobs}) must be >= 0")
        if not 1 <= self.default_max_tokens <= self.max_tokens:
            raise UserError(
                f"gateway.default_max_tokens ({self.default_max_tokens}) must be between 1 "
                f"and gateway.max_tokens ({self.max_tokens})"
            )
        if self.max_context is not None and self.max_context < 2:
            raise UserError(
                f"gateway.max_context ({self.max_context}) must be >= 2 (a prompt token and "
                "one to generate), or unset for the model's own context"
            )
        if self.port is not None and not 0 <= self.port <= 65535:
            raise UserError(f"gateway.port ({self.port}) must be in 0..65535")
        if self.engine_timeout_s <= 0 or self.admission_timeout_s <= 0:
            raise UserError("gateway.engine_timeout_s and admission_timeout_s must be > 0")
        if self.roles is not None:
            self.roles = tuple(self.roles)
            for name in self.roles:
                try:
                    check_role_name(name)
                except ValueError as exc:
                    raise UserError(f"gateway.roles: {exc}") from None

    def check_role(self, role: str) -> str:
        """``role`` if this gateway serves it: 400 for a malformed name, 404 for one not
        in :attr:`roles`."""
        try:
            check_role_name(role)
        except ValueError as exc:
            raise InvalidRequest(str(exc), param="role") from None
        if self.roles is not None and role not in self.roles:
            served = ", ".join(self.roles) or "none"
            raise UnknownRole(
                f"unknown role {role!r}: this run serves {served}; add it to the config's roles"
            )
        return role

    @property
    def base_url(self) -> str:
        if self.public_url:
            return self.public_url.rstrip("/")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{DEFAULT_PORT if self.port is None else self.port}"
