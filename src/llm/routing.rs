//! Which API serves each model of the chain: with `provider = "auto"`,
//! litellm-style ids pick their API (`openrouter/…`, `anthropic/…`,
//! `openai/…`) and the rest go to the API whose key is set; with a named
//! provider every id goes to it as written. Each API gets one client, with
//! its endpoint (`llm.base_url`, the SDK variable, or the default) and key.

use std::collections::HashMap;

use super::client::{
    ApiKey, Endpoint, LlmClient, LlmError, Provider, DEFAULT_ANTHROPIC_BASE_URL, DEFAULT_OPENAI_BASE_URL,
};
use super::env::LlmEnv;
use super::link::Link;
use crate::config::{LlmConfig, LlmProvider};

pub const DEFAULT_ANTHROPIC_MODEL: &str = "claude-sonnet-4-20250514";
pub const DEFAULT_OPENAI_MODEL: &str = "gpt-4o-mini";
/// The default OpenRouter base URL (litellm's).
pub const DEFAULT_OPENROUTER_BASE_URL: &str = "https://openrouter.ai/api/v1";
/// The reference trainer's model, on OpenRouter.
pub const DEFAULT_OPENROUTER_MODEL: &str = "anthropic/claude-sonnet-4";

/// The model chain as resolved from the config and env.
pub(super) struct ResolvedChain {
    /// The configured ids (or the default model): what a hint's id names.
    pub(super) models: Vec<String>,
    /// The models that have a usable API, in order; empty: static hints.
    pub(super) links: Vec<Link>,
}

/// Resolves the model chain (each model's API, endpoint and key). A model
/// whose API has no key is left out with a warning.
pub(super) fn resolve(config: &LlmConfig, env: &LlmEnv) -> Result<ResolvedChain, LlmError> {
    let default = Route::default_for(config.provider, env);
    let models = if config.models.is_empty() {
        vec![Route::default_model(default).to_string()]
    } else {
        config.models.clone()
    };
    let mut links = Vec::new();
    if config.provider != LlmProvider::None {
        let mut router = Router {
            config,
            env,
            default,
            clients: HashMap::new(),
        };
        for id in &models {
            if let Some(link) = router.link(id)? {
                links.push(link);
            }
        }
    }
    Ok(ResolvedChain { models, links })
}

/// The APIs a model id can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Route {
    Anthropic,
    Openai,
    Openrouter,
}

/// Where a route's settings come from.
struct Api<'a> {
    key: &'a Option<String>,
    env_url: &'a Option<String>,
    default_url: &'static str,
    provider: Provider,
}

impl Route {
    /// The route of ids without a prefix: the named provider, or under
    /// `auto` the first API whose key (or, for OpenAI, base URL) is set.
    fn default_for(provider: LlmProvider, env: &LlmEnv) -> Option<Route> {
        match provider {
            LlmProvider::Anthropic => Some(Route::Anthropic),
            LlmProvider::Openai => Some(Route::Openai),
            LlmProvider::Openrouter => Some(Route::Openrouter),
            LlmProvider::None => None,
            LlmProvider::Auto if env.anthropic_api_key.is_some() => Some(Route::Anthropic),
            LlmProvider::Auto if env.openrouter_api_key.is_some() => Some(Route::Openrouter),
            LlmProvider::Auto if env.openai_api_key.is_some() || env.openai_base_url.is_some() => {
                Some(Route::Openai)
            }
            LlmProvider::Auto => None,
        }
    }

    /// The model used when the config lists none.
    fn default_model(default: Option<Route>) -> &'static str {
        match default {
            Some(Route::Openai) => DEFAULT_OPENAI_MODEL,
            Some(Route::Openrouter) => DEFAULT_OPENROUTER_MODEL,
            _ => DEFAULT_ANTHROPIC_MODEL,
        }
    }

    fn api(self, env: &LlmEnv) -> Api<'_> {
        match self {
            Route::Anthropic => Api {
                key: &env.anthropic_api_key,
                env_url: &env.anthropic_base_url,
                default_url: DEFAULT_ANTHROPIC_BASE_URL,
                provider: Provider::Anthropic,
            },
            Route::Openai => Api {
                key: &env.openai_api_key,
                env_url: &env.openai_base_url,
                default_url: DEFAULT_OPENAI_BASE_URL,
                provider: Provider::Openai,
            },
            Route::Openrouter => Api {
                key: &env.openrouter_api_key,
                env_url: &env.openrouter_base_url,
                default_url: DEFAULT_OPENROUTER_BASE_URL,
                provider: Provider::Openai,
            },
        }
    }
}

/// The API and model name of a litellm-style id (`openrouter/anthropic/
/// claude-sonnet-4`, `anthropic/claude-...`, `openai/gpt-...`); an id
/// without such a prefix goes to `default`.
fn route_of(id: &str, default: Option<Route>) -> Option<(Route, &str)> {
    [
        ("openrouter/", Route::Openrouter),
        ("anthropic/", Route::Anthropic),
        ("openai/", Route::Openai),
    ]
    .into_iter()
    .find_map(|(prefix, route)| id.strip_prefix(prefix).map(|rest| (route, rest)))
    .or_else(|| default.map(|route| (route, id)))
}

/// Builds the links of one chain, one client per API.
struct Router<'a> {
    config: &'a LlmConfig,
    env: &'a LlmEnv,
    default: Option<Route>,
    clients: HashMap<Route, LlmClient>,
}

impl Router<'_> {
    /// The link of `id`, or `None` when no API takes it or its API has no
    /// key.
    fn link(&mut self, id: &str) -> Result<Option<Link>, LlmError> {
        let routed = if self.config.provider == LlmProvider::Auto {
            route_of(id, self.default)
        } else {
            self.default.map(|r| (r, id))
        };
        let Some((route, api_model)) = routed else {
            return Ok(None);
        };
        if !self.usable(route) {
            tracing::warn!(model = %id, api = ?route, "no API key for this model's API; leaving it out of the chain");
            return Ok(None);
        }
        Ok(Some(Link {
            id: id.to_string(),
            api_model: api_model.to_string(),
            client: self.client(route)?,
            discovered: Default::default(),
        }))
    }

    /// A local OpenAI-compatible server needs no key; the hosted APIs do.
    fn usable(&self, route: Route) -> bool {
        let api = route.api(self.env);
        api.key.is_some()
            || (route == Route::Openai && api.env_url.is_some())
            || (route == Route::Openai && !self.config.base_url.is_empty())
    }

    /// The route's client, made on first use.
    fn client(&mut self, route: Route) -> Result<LlmClient, LlmError> {
        if let Some(client) = self.clients.get(&route) {
            return Ok(client.clone());
        }
        let api = route.api(self.env);
        // llm.base_url is for the provider the config names (or models
        // without a prefix).
        let configured = (Some(route) == self.default)
            .then(|| self.config.base_url.clone())
            .filter(|u| !u.is_empty());
        let base_url = configured
            .or_else(|| api.env_url.clone())
            .unwrap_or_else(|| api.default_url.to_string());
        let client = LlmClient::new(Endpoint {
            provider: api.provider,
            base_url,
            api_key: api.key.clone().map(ApiKey::new),
            ssl_cert_file: self.env.ssl_cert_file.clone(),
        })?;
        self.clients.insert(route, client.clone());
        Ok(client)
    }
}
