"""Prometheus metrics of the HTTP process, under upstream's `sglang:` names.

Request counters and latency histograms are observed when a request finishes; gauges
(running / queued requests, KV usage, throughput) are read from the scheduler at scrape time.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 300)
_ITL_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1, 2, 5)


class MetricsCollector:
    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        self.model_name = model_name
        r = self.registry

        def counter(name, doc):
            return Counter(f"sglang:{name}", doc, labels, registry=r).labels(model_name)

        def gauge(name, doc):
            return Gauge(f"sglang:{name}", doc, labels, registry=r).labels(model_name)

        def histogram(name, doc, buckets):
            return Histogram(f"sglang:{name}", doc, labels, buckets=buckets, registry=r).labels(model_name)

        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens processed.")
        self.generation_tokens = counter("generation_tokens", "Tokens generated.")
        self.num_requests = counter("num_requests", "Requests finished (any finish reason).")
        self.time_to_first_token = histogram("time_to_first_token_seconds", "Time to first token.", _LATENCY_BUCKETS)
        self.inter_token_latency = histogram("inter_token_latency_seconds", "Time between output tokens.", _ITL_BUCKETS)
        self.e2e_request_latency = histogram("e2e_request_latency_seconds", "Request latency.", _LATENCY_BUCKETS)
        self.queue_time = histogram("queue_time_seconds", "Time waiting before the first prefill.", _LATENCY_BUCKETS)
        self.num_running_reqs = gauge("num_running_reqs", "Requests in the running batch.")
        self.num_queue_reqs = gauge("num_queue_reqs", "Requests waiting to be scheduled.")
        self.token_usage = gauge("token_usage", "Share of KV slots in use (requests and cache).")
        self.gen_throughput = gauge("gen_throughput", "Generation throughput of the last step (token/s).")
        self.cache_hit_rate = gauge("cache_hit_rate", "Share of prompt tokens served from the prefix cache.")
        self.spec_accept_length = gauge("spec_accept_length", "Speculative decoding: mean tokens per verify step.")
        self.spec_accept_rate = gauge("spec_accept_rate", "Speculative decoding: accepted / proposed draft tokens.")
        self.spec_num_steps = gauge("spec_num_steps", "Speculative decoding: draft tokens per step (k).")
        self.spec_num_draft_tokens = gauge("spec_num_draft_tokens", "Speculative decoding: tokens verified per step.")
        self.spec_phase_ms = {
            phase: gauge(f"spec_{phase}_ms", f"Speculative decoding: mean {what} time per step (ms).")
            for phase, what in (("draft", "draft chain"), ("verify", "target verify"), ("extend", "draft extend"))
        }
        self.spec_current_k = gauge(
            "spec_current_steps", "Speculative decoding: k the policy chose for the last decode step (0 = plain)."
        )
        self.spec_switches = gauge(
            "spec_mode_switches", "Speculative decoding: decode steps whose k differed from the step before."
        )
        self.spec_prompts_without_draft = gauge(
            "spec_prompts_without_draft",
            "Speculative decoding: requests admitted without the draft's pass over "
            "their prompt (speculation did not pay at the batch they joined, or they opted out); they decode plainly.",
        )
        self.spec_draft_explorations = gauge(
            "spec_draft_explorations",
            "Speculative decoding: requests given the draft although the acceptance "
            "estimate said it would not pay, to refresh the estimate.",
        )
        self.spec_draft_adoptions = gauge(
            "spec_draft_adoptions",
            "Speculative decoding: requests admitted without the draft that it adopted "
            "mid-decode, once the load dropped (it ran over their context; they speculate from then on).",
        )
        self.spec_draft_drops = gauge(
            "spec_draft_drops",
            "Speculative decoding: running requests the draft stopped following while plain "
            "decoding held and speculation would not pay (their plain steps then run the target alone).",
        )
        self.spec_steps_by_k = Gauge(
            "sglang:spec_decode_steps",
            "Speculative decoding: decode steps run with each k (0 = plain).",
            labels + ["k"],
            registry=r,
        )
        self.spec_position_acceptance = Gauge(
            "sglang:spec_position_acceptance",
            "Speculative decoding: the policy's current estimate of the chance that "
            "draft i is accepted given drafts 1..i-1 were (pooled over requests).",
            labels + ["position"],
            registry=r,
        )
        self.spec_expected_tokens = Gauge(
            "sglang:spec_expected_tokens",
            "Speculative decoding: the policy's current estimate of output tokens per "
            "request in a step of k drafts (k = 0: 1).",
            labels + ["k"],
            registry=r,
        )
        self.spec_step_cost_ms = Gauge(
            "sglang:spec_step_cost_ms",
            "Speculative decoding: milliseconds per decode step of k drafts at a batch "
            "bucket, as the cost policy prices it: source=prior (the start-up table) or learned (the server's own "
            "steady steps).",
            labels + ["k", "bucket", "source"],
            registry=r,
        )
        self.spec_exploration_share = gauge(
            "spec_exploration_share",
            "Speculative decoding: share of decode steps the cost policy spent exploring other candidates.",
        )
        self.spec_exploration_cost_share = gauge(
            "spec_exploration_cost_share",
            "Speculative decoding: estimated share of decode time exploration gave up against the chosen k.",
        )
        self.spec_decisions = gauge(
            "spec_policy_decisions",
            "Speculative decoding: switches the cost policy decided (exploration's own moves not counted).",
        )
        self._prompt_total = 0
        self._cached_total = 0

    def observe_finished(self, meta: dict, ttft: float | None, queue_time: float | None) -> None:
        prompt, completion = meta.get("prompt_tokens", 0), meta.get("completion_tokens", 0)
        e2e = meta.get("e2e_latency", 0.0)
        self.num_requests.inc()
        self.prompt_tokens.inc(prompt)
        self.generation_tokens.inc(completion)
        self.e2e_request_latency.observe(e2e)
        self._prompt_total += prompt
        self._cached_total += meta.get("cached_tokens", 0)
        if queue_time is not None:
            self.queue_time.observe(queue_time)
        if ttft is None:
            return
        self.time_to_first_token.observe(ttft)
        # One observation per gap between output tokens, each the request's mean gap.
        if completion > 1:
            gap = max(e2e - ttft, 0.0) / (completion - 1)
            for _ in range(completion - 1):
                self.inter_token_latency.observe(gap)

    def update_gauges(self, state: dict) -> None:
        self.num_running_reqs.set(state["num_running_reqs"])
        self.num_queue_reqs.set(state["num_queue_reqs"])
        self.token_usage.set(state["token_usage"])
        self.gen_throughput.set(state["last_step_throughput"])
        if self._prompt_total:
            self.cache_hit_rate.set(self._cached_total / self._prompt_total)
        if "speculative_num_steps" in state:
            self.spec_accept_length.set(state["avg_spec_accept_length"])
            self.spec_accept_rate.set(state["spec_accept_rate"])
            self.spec_num_steps.set(state["speculative_num_steps"])
            self.spec_num_draft_tokens.set(state["speculative_num_steps"] + 1)
            for phase, value in state["spec_phase_ms"].items():
                if phase in self.spec_phase_ms:
                    self.spec_phase_ms[phase].set(value)
            policy = state.get("spec_policy", {})
            if policy.get("k") is not None:
                self.spec_current_k.set(policy["k"])
            self.spec_switches.set(policy.get("switches", 0))
            self.spec_prompts_without_draft.set(state.get("spec_prompts_without_draft", 0))
            self.spec_draft_explorations.set(state.get("spec_draft_explorations", 0))
            self.spec_draft_adoptions.set(state.get("spec_draft_adoptions", 0))
            self.spec_draft_drops.set(state.get("spec_draft_drops", 0))
            for k, steps in state.get("spec_steps_by_k", {}).items():
                self.spec_steps_by_k.labels(self.model_name, str(k)).set(steps)
            for position, rate in enumerate(policy.get("acceptance_rates", []), start=1):
                self.spec_position_acceptance.labels(self.model_name, str(position)).set(rate)
            for k, tokens in policy.get("expected_tokens", {}).items():
                self.spec_expected_tokens.labels(self.model_name, str(k)).set(tokens)
            self._update_costs(policy)

    def _update_costs(self, policy: dict) -> None:
        cost = policy.get("cost")
        if not cost:
            return
        prior = {0: cost["prior"]["plain_ms"], **cost["prior"]["spec_ms"]}
        for source, table in (("prior", prior), ("learned", cost["learned_ms"])):
            for k, by_bucket in table.items():
                for bucket, ms in by_bucket.items():
                    self.spec_step_cost_ms.labels(self.model_name, str(k), str(bucket), source).set(ms)
        exploration = policy.get("exploration", {})
        self.spec_exploration_share.set(exploration.get("share", 0.0))
        self.spec_exploration_cost_share.set(exploration.get("cost_share", 0.0))
        self.spec_decisions.set(policy.get("decisions", 0))

    def render(self) -> bytes:
        return generate_latest(self.registry)
