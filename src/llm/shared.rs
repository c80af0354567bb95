//! What one synthesizer's calls share, handed by reference down the
//! pipeline (`chain` → `fitting` → `call` → `retry` → `hedge` → `send`):
//! its config and prompt version, and the state its arms share with it
//! (limits, hedging, observer, cassette, system context, prompt cache,
//! saturation).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use super::cassette::Cassette;
use super::context::SystemContext;
use super::hedger::Hedger;
use super::limits::CallLimits;
use super::observer::SynthObserver;
use super::prompt_cache::PromptCache;
use super::saturation::Saturation;
use crate::config::{LlmConfig, PromptVersion};
use crate::messages::HintLevel;

pub(super) struct Shared {
    pub(super) config: LlmConfig,
    /// The prompt sent (`llm.prompt_version`, or the arm's).
    pub(super) prompt: PromptVersion,
    /// The level its prompt asks for (one synthesizer per level of an arm
    /// with levels); `None`: the plain prompt.
    pub(super) level: Option<HintLevel>,
    /// Shared by every arm's synthesizer: the rate limits, the calls in
    /// flight and the budget bound the stage, not each arm.
    pub(super) limits: Arc<CallLimits>,
    /// Shared by every arm's synthesizer, like `limits`; `None` when
    /// `llm.hedge` is off.
    pub(super) hedger: Option<Arc<Hedger>>,
    pub(super) observer: Option<Arc<dyn SynthObserver>>,
    pub(super) cassette: Option<Arc<Cassette>>,
    /// `llm.system_context_file` and `_dir`, read at start-up; shared by
    /// every arm.
    pub(super) context: Arc<SystemContext>,
    /// Where requests ask for prompt caching, and the tasks sent recently.
    pub(super) prompt_cache: Arc<PromptCache>,
    /// Set once a model API answered anything (readiness).
    pub(super) answered: AtomicBool,
    /// Timeouts while queued, by model, shared like `limits`.
    pub(super) saturation: Arc<Saturation>,
}

impl Shared {
    /// A synthesizer's state of its own, from `config`, with the system
    /// context read at start-up.
    pub(super) fn new(config: &LlmConfig, context: SystemContext) -> Self {
        Shared {
            config: config.clone(),
            prompt: config.prompt_version,
            level: None,
            limits: Arc::new(CallLimits::new(config)),
            hedger: Hedger::new(config),
            observer: None,
            cassette: None,
            context: Arc::new(context),
            prompt_cache: Arc::new(PromptCache::new(config)),
            answered: AtomicBool::new(false),
            saturation: Arc::default(),
        }
    }

    /// An arm's: its own `config` (its chain and prompt), this one's
    /// limits, hedging, observer, cassette, context, prompt cache and
    /// saturation.
    pub(super) fn for_arm(&self, config: LlmConfig) -> Self {
        Shared {
            prompt: config.prompt_version,
            level: None,
            config,
            limits: self.limits.clone(),
            hedger: self.hedger.clone(),
            observer: self.observer.clone(),
            cassette: self.cassette.clone(),
            context: self.context.clone(),
            prompt_cache: self.prompt_cache.clone(),
            answered: AtomicBool::new(false),
            saturation: self.saturation.clone(),
        }
    }

    /// Tells the observer how many HTTP attempts are in flight.
    pub(super) fn observe_in_flight(&self) {
        if let Some(o) = &self.observer {
            o.calls_in_flight(self.limits.in_flight());
        }
    }

    /// Tells the observer what is left of the spend budgets.
    pub(super) fn observe_budget(&self) {
        if let Some(o) = &self.observer {
            if let Some(remaining) = self.limits.remaining() {
                o.budget(remaining);
            }
        }
    }
}
