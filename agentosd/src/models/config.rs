//! The model gateway's configuration (`--models FILE`, default `/etc/agentos/models.yaml`): the
//! backends the daemon may forward model calls to, where each runs, which models it serves, the
//! credentials the daemon keeps for it, and token budgets per tenant.
//!
//! ```yaml
//! backends:
//!   - name: local-llama
//!     url: http://127.0.0.1:8080          # an OpenAI-compatible server; `/v1` is implied
//!     placement: local                    # local | on-prem | cloud
//!     models:
//!       - name: smollm2-135m               # what agents ask for
//!         upstream: SmolLM2-135M           # what the backend calls it (default: name)
//!         kind: chat                       # chat | embeddings
//!     api_key_file: /etc/agentos/keys/local   # root-only; or api_key_credential: NAME
//!     # ca_file: /etc/agentos/ca.pem     # https:// backends: more CAs besides the host's store
//! tenants:
//!   acme: { tokens: 1000000, tokens_per_minute: 20000 }
//! ```
//!
//! A key is read once, by the daemon, from a file owned by root and readable by nobody else
//! (opened without following links), or from systemd's `$CREDENTIALS_DIRECTORY`. Agents never see
//! it: it goes only into the `Authorization` header of the daemon's own request to the backend.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Where the gateway's configuration is read from when `--models` is not given.
pub const DEFAULT_PATH: &str = "/etc/agentos/models.yaml";

/// Why the models configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {msg}", path.display())]
    Parse { path: PathBuf, msg: String },
    #[error("{}: backend {backend:?}: {msg}", path.display())]
    Backend {
        path: PathBuf,
        backend: String,
        msg: String,
    },
}

/// `placement:` of a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    Local,
    OnPrem,
    Cloud,
}

impl Placement {
    pub fn as_str(self) -> &'static str {
        match self {
            Placement::Local => "local",
            Placement::OnPrem => "on-prem",
            Placement::Cloud => "cloud",
        }
    }
}

/// What a model does: the endpoint it is served on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    #[default]
    Chat,
    Embeddings,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    name: String,
    upstream: Option<String>,
    #[serde(default)]
    kind: ModelKind,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackend {
    name: String,
    url: String,
    placement: Placement,
    models: Vec<RawModel>,
    api_key_file: Option<PathBuf>,
    api_key_credential: Option<String>,
    /// More CAs to trust for an https backend (PEM), besides the host's store.
    ca_file: Option<PathBuf>,
    timeout_s: Option<u64>,
    max_concurrent: Option<usize>,
}

/// Token budgets of a tenant (all its agents together).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantBudget {
    pub tokens: Option<u64>,
    pub tokens_per_minute: Option<u64>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    backends: Vec<RawBackend>,
    #[serde(default)]
    tenants: BTreeMap<String, TenantBudget>,
}

/// A backend, checked: a plain-HTTP origin (`host:port`), its models and its key.
#[derive(Clone)]
pub struct Backend {
    pub name: String,
    /// `host:port` to connect to.
    pub authority: String,
    /// The path prefix of its OpenAI API (`/v1`).
    pub base_path: String,
    pub placement: Placement,
    pub timeout: std::time::Duration,
    /// Requests to it in flight at once, over all agents.
    pub max_concurrent: usize,
    /// For `https://`: the TLS configuration and the name its certificate must carry.
    pub tls: Option<(
        std::sync::Arc<rustls::ClientConfig>,
        rustls::pki_types::ServerName<'static>,
    )>,
    api_key: Option<String>,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("name", &self.name)
            .field("authority", &self.authority)
            .field("placement", &self.placement)
            .field("api_key", &self.api_key.as_ref().map(|_| "(set)"))
            .finish()
    }
}

impl Backend {
    /// The `Authorization` header value, when the backend has a key.
    pub fn authorization(&self) -> Option<String> {
        self.api_key.as_ref().map(|k| format!("Bearer {k}"))
    }
}

/// A model as agents name it, and where it is served.
#[derive(Debug, Clone)]
pub struct ModelEntry {
    pub name: String,
    pub upstream: String,
    pub kind: ModelKind,
    /// Index into [`ModelsConfig::backends`].
    pub backend: usize,
}

/// The checked configuration.
#[derive(Debug, Clone, Default)]
pub struct ModelsConfig {
    pub backends: Vec<Backend>,
    /// By the name agents use; a name served by two backends is an error.
    pub models: BTreeMap<String, ModelEntry>,
    pub tenants: BTreeMap<String, TenantBudget>,
    /// The file it came from.
    pub source: Option<PathBuf>,
}

impl ModelsConfig {
    /// Reads `path`. `Ok(None)` when the file does not exist and `explicit` is false (the
    /// default path: no gateway backends configured).
    pub fn load(path: &Path, explicit: bool) -> Result<Option<ModelsConfig>, ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => return Ok(None),
            Err(source) => {
                return Err(ConfigError::Read {
                    path: path.into(),
                    source,
                });
            }
        };
        let creds = std::env::var_os("CREDENTIALS_DIRECTORY").map(PathBuf::from);
        Self::parse(&text, path, creds.as_deref()).map(Some)
    }

    /// Parses and checks the text of `path` (keys are read here).
    pub fn parse(
        text: &str,
        path: &Path,
        creds: Option<&Path>,
    ) -> Result<ModelsConfig, ConfigError> {
        let raw: RawConfig = serde_saphyr::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.into(),
            msg: e.to_string(),
        })?;
        let mut cfg = ModelsConfig {
            tenants: raw.tenants,
            source: Some(path.into()),
            ..Default::default()
        };
        for (i, b) in raw.backends.into_iter().enumerate() {
            let err = |msg: String| ConfigError::Backend {
                path: path.into(),
                backend: b.name.clone(),
                msg,
            };
            if cfg.backends.iter().any(|x| x.name == b.name) {
                return Err(err("a second backend of this name".into()));
            }
            let url = parse_url(&b.url).map_err(err)?;
            let tls = match (url.tls, &b.ca_file) {
                (true, ca) => Some((
                    super::tls::client_config(ca.as_deref()).map_err(err)?,
                    super::tls::server_name(&url.host).map_err(err)?,
                )),
                (false, Some(_)) => {
                    return Err(err("ca_file is for https:// backends".into()));
                }
                (false, None) => None,
            };
            let api_key = match (&b.api_key_file, &b.api_key_credential) {
                (Some(_), Some(_)) => {
                    return Err(err(
                        "give api_key_file or api_key_credential, not both".into()
                    ));
                }
                (Some(f), None) => Some(read_key(f).map_err(err)?),
                (None, Some(c)) => Some(read_credential(creds, c).map_err(err)?),
                (None, None) => None,
            };
            if b.models.is_empty() {
                return Err(err("serves no models (models: [...])".into()));
            }
            for m in b.models {
                if m.name.is_empty() || m.name.len() > 128 || m.name.contains(char::is_whitespace) {
                    return Err(err(format!("model name {:?} is not a valid name", m.name)));
                }
                if let Some(other) = cfg.models.get(&m.name) {
                    return Err(err(format!(
                        "model {} is also served by backend {}; a name routes to one backend",
                        m.name, cfg.backends[other.backend].name
                    )));
                }
                let upstream = m.upstream.unwrap_or_else(|| m.name.clone());
                cfg.models.insert(
                    m.name.clone(),
                    ModelEntry {
                        name: m.name,
                        upstream,
                        kind: m.kind,
                        backend: i,
                    },
                );
            }
            cfg.backends.push(Backend {
                name: b.name,
                authority: url.authority,
                base_path: url.base_path,
                tls,
                placement: b.placement,
                timeout: std::time::Duration::from_secs(b.timeout_s.unwrap_or(300).max(1)),
                max_concurrent: b.max_concurrent.unwrap_or(16).max(1),
                api_key,
            });
        }
        Ok(cfg)
    }

    /// The backend serving `model`.
    pub fn route(&self, model: &str) -> Option<(&ModelEntry, &Backend)> {
        let m = self.models.get(model)?;
        Some((m, &self.backends[m.backend]))
    }
}

/// A backend's URL, split.
struct Url {
    tls: bool,
    /// `host:port` to connect to.
    authority: String,
    host: String,
    base_path: String,
}

/// `http[s]://host[:port][/path]` (port 80 or 443 when absent, path `/v1` when absent).
fn parse_url(url: &str) -> Result<Url, String> {
    let (tls, rest) = if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("http://") {
        (false, r)
    } else {
        return Err(format!("url {url}: must start with http:// or https://"));
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if authority.is_empty() || authority.contains('@') {
        return Err(format!("url {url}: needs host[:port] and no user info"));
    }
    let (host, authority) = match authority.rsplit_once(':') {
        Some((h, p))
            if !p.is_empty()
                && p.bytes().all(|b| b.is_ascii_digit())
                && !authority.ends_with(']') =>
        {
            (h.to_string(), authority.to_string())
        }
        _ => (
            authority.to_string(),
            format!("{authority}:{}", if tls { 443 } else { 80 }),
        ),
    };
    let path = path.trim_end_matches('/');
    let base_path = if path.is_empty() {
        "/v1".to_string()
    } else {
        path.to_string()
    };
    Ok(Url {
        tls,
        authority,
        host,
        base_path,
    })
}

/// A key from a root-only file: opened without following a link, owned by root, mode at most
/// 0600, one line.
fn read_key(path: &Path) -> Result<String, String> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| format!("api_key_file {}: {e}", path.display()))?;
    let md = f
        .metadata()
        .map_err(|e| format!("api_key_file {}: {e}", path.display()))?;
    if !md.is_file() || md.uid() != 0 || md.mode() & 0o077 != 0 {
        return Err(format!(
            "api_key_file {}: must be a regular file owned by root and readable by nobody else \
             (chown root: and chmod 600); it is uid {} mode {:o}",
            path.display(),
            md.uid(),
            md.mode() & 0o7777
        ));
    }
    let mut text = String::new();
    use std::io::Read as _;
    f.take(64 * 1024)
        .read_to_string(&mut text)
        .map_err(|e| format!("api_key_file {}: {e}", path.display()))?;
    one_line_key(&text).map_err(|m| format!("api_key_file {}: {m}", path.display()))
}

/// A key from systemd's credentials directory (`LoadCredential=NAME:…`).
fn read_credential(dir: Option<&Path>, name: &str) -> Result<String, String> {
    let dir = dir.ok_or_else(|| {
        format!(
            "api_key_credential {name}: $CREDENTIALS_DIRECTORY is not set (add \
             LoadCredential={name}:PATH to agentosd.service)"
        )
    })?;
    if name.is_empty() || name.contains('/') || name.starts_with('.') {
        return Err(format!(
            "api_key_credential {name:?}: not a credential name"
        ));
    }
    let text = std::fs::read_to_string(dir.join(name))
        .map_err(|e| format!("api_key_credential {name}: {e}"))?;
    one_line_key(&text).map_err(|m| format!("api_key_credential {name}: {m}"))
}

fn one_line_key(text: &str) -> Result<String, String> {
    let k = text.trim();
    if k.is_empty() || k.contains(['\n', '\r']) || !k.is_ascii() {
        return Err("must hold the key on one line of ASCII".into());
    }
    Ok(k.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_parses_with_defaults() {
        let c = ModelsConfig::parse(
            "backends:\n  - name: l\n    url: http://127.0.0.1:8080\n    placement: local\n    models: [{name: m1}, {name: e1, kind: embeddings, upstream: E}]\ntenants:\n  acme: {tokens: 10}\n",
            Path::new("models.yaml"),
            None,
        )
        .unwrap();
        let (m, b) = c.route("m1").unwrap();
        assert_eq!((m.upstream.as_str(), m.kind), ("m1", ModelKind::Chat));
        assert_eq!(
            (b.authority.as_str(), b.base_path.as_str()),
            ("127.0.0.1:8080", "/v1")
        );
        assert_eq!(c.route("e1").unwrap().0.upstream, "E");
        assert_eq!(c.tenants["acme"].tokens, Some(10));
        assert!(b.authorization().is_none());
    }

    #[test]
    fn an_https_backend_defaults_to_port_443_and_checks_its_name() {
        let c = ModelsConfig::parse(
            "backends:\n  - {name: h, url: https://api.example.com, placement: cloud, models: [{name: m}]}\n",
            Path::new("m.yaml"),
            None,
        );
        // Hosts without a certificate store (no ca-certificates) cannot trust anyone.
        let Ok(c) = c else {
            let e = c.unwrap_err().to_string();
            assert!(e.contains("ca-certificates"), "{e}");
            return;
        };
        let b = &c.backends[0];
        assert_eq!(
            (b.authority.as_str(), b.base_path.as_str()),
            ("api.example.com:443", "/v1")
        );
        let (_, name) = b.tls.as_ref().unwrap();
        assert_eq!(name.to_str(), "api.example.com");
    }

    #[test]
    fn bad_configs_name_the_backend_and_the_problem() {
        for (text, want) in [
            (
                "backends:\n  - {name: a, url: http://x:1, placement: cloud, models: [{name: m}], ca_file: /x}\n",
                "ca_file is for https",
            ),
            (
                "backends:\n  - {name: a, url: https://x.example, placement: cloud, models: [{name: m}], ca_file: /nonexistent.pem}\n",
                "/nonexistent.pem",
            ),
            (
                "backends:\n  - {name: a, url: ftp://x, placement: cloud, models: [{name: m}]}\n",
                "http://",
            ),
            (
                "backends:\n  - {name: a, url: http://x:1, placement: mars, models: [{name: m}]}\n",
                "mars",
            ),
            (
                "backends:\n  - {name: a, url: http://x:1, placement: local, models: []}\n",
                "serves no models",
            ),
            (
                "backends:\n  - {name: a, url: http://x:1, placement: local, models: [{name: m}]}\n  - {name: b, url: http://x:2, placement: local, models: [{name: m}]}\n",
                "also served",
            ),
            (
                "backends:\n  - {name: a, url: http://x:1, placement: local, models: [{name: m}], api_key_file: /nonexistent/k}\n",
                "/nonexistent/k",
            ),
            ("backend: []\n", "backend"),
        ] {
            let e = ModelsConfig::parse(text, Path::new("m.yaml"), None)
                .unwrap_err()
                .to_string();
            assert!(e.contains(want) && e.contains("m.yaml"), "{text} → {e}");
        }
    }

    #[test]
    fn a_key_file_must_be_root_only_and_is_never_printed() {
        let d = tempfile::tempdir().unwrap();
        let k = d.path().join("k");
        std::fs::write(&k, "sk-secret\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&k, std::fs::Permissions::from_mode(0o644)).unwrap();
        let text = format!(
            "backends:\n  - {{name: a, url: http://x:1/api, placement: cloud, models: [{{name: m}}], api_key_file: {}}}\n",
            k.display()
        );
        let e = ModelsConfig::parse(&text, Path::new("m.yaml"), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("chmod 600") && !e.contains("sk-secret"), "{e}");
        std::fs::set_permissions(&k, std::fs::Permissions::from_mode(0o600)).unwrap();
        if nix::unistd::geteuid().is_root() {
            let c = ModelsConfig::parse(&text, Path::new("m.yaml"), None).unwrap();
            let b = &c.backends[0];
            assert_eq!(b.authorization().as_deref(), Some("Bearer sk-secret"));
            assert_eq!(b.base_path, "/api");
            assert!(!format!("{b:?}").contains("sk-secret"));
        }
        // A link to a good key file is not followed.
        let l = d.path().join("l");
        std::os::unix::fs::symlink(&k, &l).unwrap();
        let text = text.replace(k.to_str().unwrap(), l.to_str().unwrap());
        assert!(ModelsConfig::parse(&text, Path::new("m.yaml"), None).is_err());
    }
}
