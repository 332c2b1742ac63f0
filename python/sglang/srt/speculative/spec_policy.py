"""The per-step mode switch of speculative decoding: before each decode step the scheduler asks a
policy how many draft tokens k to verify (k = 0 is PLAIN, a target-only decode step).

At small batches the target step is memory bound and verifying extra positions is nearly free; at
large batches it is compute bound and a verify costs several times a plain step. The cost policy
weighs both with measured step times and observed acceptance; always, never and a batch-size
threshold are there for baselines and for users who know their load.

Adding a policy is a SpecPolicy subclass and register_policy(name, class) (the registry at the end,
which ServerArgs, the worker and the scheduler ask). Pure Python: nothing here touches the device."""

from __future__ import annotations

import dataclasses
import importlib
import logging
from abc import ABC, abstractmethod
from typing import Callable, Optional, Union

from sglang.srt.configs.speculative_adaptive import _is_int, parse_adaptive_config
from sglang.srt.speculative.acceptance import AcceptanceEstimator
from sglang.srt.speculative.cost_model import CostTable

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PolicyOptions:
    """What the --speculative-* flags tell a policy (options_from_args reads them)."""

    k_max: int  # --speculative-num-steps
    threshold: Optional[int] = None  # --speculative-threshold
    candidates: Optional[list[int]] = None  # --speculative-candidate-steps
    # From --speculative-adaptive-config (configs/speculative_adaptive.py), whose path errors name.
    candidates_by_bs: Optional[dict[int, list[int]]] = None
    hysteresis_by_bs: Optional[dict[int, dict[str, float]]] = None
    ema_alpha: Optional[float] = None
    config_path: Optional[str] = None


class SpecPolicy(ABC):
    """Base policy. choose() is the template: subclasses decide in _choose(); the base counts
    steps per k and switches (a step whose k differs from the previous one's) for the logs and
    /metrics. The class attributes and classmethods answer for the flags before a policy exists."""

    name = "base"
    help = ""  # its part of --speculative-policy's help
    # Whether a plain step may decode requests the draft follows (the worker captures that step's
    # graphs): false only where every plain step is one of requests the draft does not follow.
    plain_steps_follow_draft = True
    # Whether it prices steps by the step costs the worker measures at start-up (`create`'s cost).
    needs_step_costs = False

    @classmethod
    def check(cls, options: PolicyOptions) -> None:
        """Raises ValueError, naming the flag, where the options do not fit this policy."""
        k_max = options.k_max
        if not _is_int(k_max) or k_max < 1:
            raise ValueError(f"--speculative-num-steps (k_max) must be an integer >= 1, got {k_max!r}")
        if options.threshold is not None:
            raise ValueError(
                f"--speculative-threshold applies to --speculative-policy threshold only (the policy is {cls.name})"
            )
        if options.candidates is not None and not options.candidates:
            raise ValueError("--speculative-candidate-steps: the list is empty")
        for k in options.candidates or ():
            if not _is_int(k) or not 0 <= k <= k_max:
                raise ValueError(
                    f"--speculative-candidate-steps: {k} is outside 0..{k_max} (--speculative-num-steps is the largest k)"
                )
        where = " ".join(filter(None, ("--speculative-adaptive-config", options.config_path)))
        for bs, steps in (options.candidates_by_bs or {}).items():
            if max(steps) > k_max:
                raise ValueError(
                    f"{where}: batch size {bs} lists {max(steps)} steps, more than --speculative-num-steps ({k_max})"
                )
        if options.ema_alpha is not None and not 0 < options.ema_alpha <= 1:
            raise ValueError(f"{where}: ema_alpha must be in (0, 1], got {options.ema_alpha}")

    @classmethod
    def reachable_steps(cls, options: PolicyOptions) -> list[int]:
        """Every k > 0 it can choose: the worker captures graphs for these."""
        return [options.k_max]

    @classmethod
    def create(cls, options: PolicyOptions, estimator: AcceptanceEstimator, cost, exploration) -> "SpecPolicy":
        """The policy for checked options; `cost`: the start-up cost table (CostTable) or None,
        `exploration`: an Exploration or None (the policy's default)."""
        return cls(options.k_max, estimator)

    def __init__(self, k_max: int, estimator: Optional[AcceptanceEstimator] = None):
        self.k_max = k_max
        self.estimator = estimator if estimator is not None else AcceptanceEstimator(k_max)
        self.current_k: Optional[int] = None
        self.decided_k = 0  # the last choose's k before an acceptance probe (`explore`)
        self.num_switches = 0
        self.steps_per_k: dict[int, int] = {}
        self.steps_in_current = 0  # steps run in a row with current_k, the one that chose it included
        # Expected tokens per second of each candidate k at the last evaluation (for the log line).
        self.last_objective: dict[int, float] = {}

    def choose(self, rids: list[str], context_tokens: int = 0, num_plain_only: int = 0, explore: bool = False) -> int:
        """k for the next decode step of this batch; 0 = PLAIN. rids: its requests that may
        speculate; num_plain_only: those that opted out; context_tokens: their summed context.
        `explore`: where the policy would decode plainly, take its cheapest speculative step
        instead (to measure acceptance; the scheduler asks for it)."""
        k = self.decided_k = 0 if num_plain_only and not rids else self._choose(rids, context_tokens, num_plain_only)
        if explore and k == 0 and rids:
            k = self._explore_k(len(rids) + num_plain_only)
        if k != self.current_k:  # a switch, unless it is the first step
            self.num_switches += self.current_k is not None
            self.current_k, self.steps_in_current = k, 0
        self.steps_in_current += 1
        self.steps_per_k[k] = self.steps_per_k.get(k, 0) + 1
        return k

    def _choose(self, rids: list[str], context_tokens: int, num_plain_only: int) -> int:
        """The policy's k for this batch (current_k and steps_in_current describe the steps so far):
        k_max where it would speculate."""
        return self.k_max if self._would_speculate(rids, context_tokens, num_plain_only) else 0

    def _explore_k(self, batch_size: int) -> int:
        return 1

    def would_speculate(self, rids: list[str], context_tokens: int = 0, num_plain_only: int = 0) -> bool:
        """Whether a decode batch like this would speculate, judged afresh (no hysteresis, no
        dwell, nothing recorded): the scheduler asks it when admitting a request, with the batch
        the request joins, since the draft reads only the prompts admitted while speculation pays."""
        return bool(rids) and self._would_speculate(rids, context_tokens, num_plain_only)

    @abstractmethod
    def _would_speculate(self, rids: list[str], context_tokens: int, num_plain_only: int) -> bool:
        """would_speculate for a batch with at least one request that may speculate."""

    def would_speculate_at_prior(self, batch_size: int, context_tokens: int = 0) -> bool:
        """would_speculate for `batch_size` requests with acceptance at the estimator's prior: whether
        speculation could pay here at all (SpecScheduling.draft_reads_prompt's exploration)."""
        return batch_size > 0 and self._at_prior(batch_size, context_tokens)

    def _at_prior(self, batch_size: int, context_tokens: int) -> bool:
        # Policies that do not read the estimate decide as always.
        return self._would_speculate([""] * batch_size, context_tokens, 0)

    def observe_verify(self, rids: list[str], num_out: list[int], k_step: int) -> None:
        self.estimator.record_verify(rids, num_out, k_step)

    def observe_probe(self, rids: list[str], hits: list[bool]) -> None:
        self.estimator.record_probe(rids, hits)

    def observe_step_seconds(self, batch_size: int, k: int, context_tokens: int, seconds: float) -> None:
        """What one steady decode step of k drafts cost the server, from its launch to the next
        (SpecScheduling.on_launch). Only the cost policy learns from it."""

    def forget(self, rid: str) -> None:
        self.estimator.forget(rid)

    def summary(self) -> dict:
        return {
            "name": self.name,
            "k": self.current_k,
            "switches": self.num_switches,
            "steps_per_k": dict(sorted(self.steps_per_k.items())),
            **self.estimator.summary(),
        }


class AlwaysPolicy(SpecPolicy):
    """Speculate with k_max on every step (the classic static EAGLE setup)."""

    name = "always"
    help = "k = --speculative-num-steps; the default without --speculative-adaptive"
    plain_steps_follow_draft = False  # it decodes plainly only a batch that has no request to speculate

    def _would_speculate(self, rids: list[str], context_tokens: int, num_plain_only: int) -> bool:
        return True


class NeverPolicy(SpecPolicy):
    """Never speculate: the baseline, with the draft loaded but never run."""

    name = "never"
    help = "plain steps only; the draft is loaded but never runs"

    @classmethod
    def reachable_steps(cls, options: PolicyOptions) -> list[int]:
        return []

    def _would_speculate(self, rids: list[str], context_tokens: int, num_plain_only: int) -> bool:
        return False


class ThresholdPolicy(SpecPolicy):
    """Speculate with k_max while the decode batch has at most `threshold` requests."""

    name = "threshold"
    help = "speculate while the decode batch has at most --speculative-threshold requests"

    def __init__(self, k_max: int, threshold: int, estimator: Optional[AcceptanceEstimator] = None):
        super().__init__(k_max, estimator)
        self.threshold = threshold

    @classmethod
    def check(cls, options: PolicyOptions) -> None:
        if options.threshold is None or options.threshold < 0:
            raise ValueError(
                "--speculative-policy threshold needs --speculative-threshold N >= 0 (speculate "
                f"while the decode batch has at most N requests), got {options.threshold}"
            )
        super().check(dataclasses.replace(options, threshold=None))

    @classmethod
    def create(cls, options: PolicyOptions, estimator: AcceptanceEstimator, cost, exploration) -> SpecPolicy:
        return cls(options.k_max, options.threshold, estimator)

    def _would_speculate(self, rids: list[str], context_tokens: int, num_plain_only: int) -> bool:
        return len(rids) + num_plain_only <= self.threshold

    def summary(self) -> dict:
        return {**super().summary(), "threshold": self.threshold}


# --speculative-policy NAME -> its class, or "module:Class" imported when first asked for.
_POLICIES: dict[str, Union[str, type[SpecPolicy]]] = {
    "always": AlwaysPolicy,
    "never": NeverPolicy,
    "threshold": ThresholdPolicy,
    "cost": "sglang.srt.speculative.cost_policy:CostPolicy",
}


def register_policy(name: str, policy: Union[str, type[SpecPolicy]]) -> None:
    """Makes `policy` (a SpecPolicy subclass, or "module:Class") --speculative-policy NAME."""
    _POLICIES[name] = policy


def policy_names() -> tuple[str, ...]:
    return tuple(_POLICIES)


def policy_class(name: str) -> type[SpecPolicy]:
    if name not in _POLICIES:
        raise ValueError(f"--speculative-policy must be one of {', '.join(_POLICIES)}; got {name!r}")
    entry = _POLICIES[name]
    if isinstance(entry, str):
        module, _, attr = entry.partition(":")
        entry = _POLICIES[name] = getattr(importlib.import_module(module), attr)
    return entry


def policy_help() -> str:
    """The policies as --speculative-policy's help lists them."""
    return ", ".join(f"{name} ({policy_class(name).help})" for name in _POLICIES)


def options_from_args(args) -> PolicyOptions:
    """The policy's options from ServerArgs (its --speculative-adaptive-config file read)."""
    path = args.speculative_adaptive_config
    config = parse_adaptive_config(path) if path is not None else {}
    from_config = {key: config.get(key) for key in ("candidates_by_bs", "hysteresis_by_bs", "ema_alpha")}
    flags = (args.speculative_num_steps, args.speculative_threshold, args.speculative_candidate_steps)
    return PolicyOptions(*flags, config_path=path, **from_config)  # k_max, threshold, candidates


def check_flags(args) -> None:
    """Checks the policy flags of ServerArgs at start-up (ValueError naming the flag)."""
    policy_class(args.speculative_policy).check(options_from_args(args))


def reachable_steps(args) -> list[int]:
    """Every k > 0 the policy ServerArgs names can choose."""
    return policy_class(args.speculative_policy).reachable_steps(options_from_args(args))


def make_policy(name: str, k_max: int, *, cost=None, exploration=None, **flags) -> SpecPolicy:
    """The policy named by --speculative-policy, with an acceptance estimator (reported by every
    policy). `flags`: PolicyOptions' fields; `cost`: the start-up CostTable where the policy
    needs_step_costs. Errors name the flag."""
    cls, options = policy_class(name), PolicyOptions(k_max, **flags)
    cls.check(options)
    estimator = AcceptanceEstimator(k_max, alpha=options.ema_alpha if options.ema_alpha is not None else 0.05)
    return cls.create(options, estimator, cost, exploration)


def policy_from_args(args, measure_step_costs: Callable[[], dict], exploration=None) -> SpecPolicy:
    """make_policy for the policy ServerArgs names; where it needs_step_costs, from
    `measure_step_costs()` (EAGLEWorkerV2.measure_step_costs)."""
    cost = None
    if policy_class(args.speculative_policy).needs_step_costs:
        measured = measure_step_costs()
        cost = CostTable(measured["plain"], measured["spec"], measured.get("context"))
        logger.debug("speculation cost table (ms per decode step, measured at start-up): %s", cost.summary())
    options = dataclasses.asdict(options_from_args(args))
    return make_policy(args.speculative_policy, cost=cost, exploration=exploration, **options)
