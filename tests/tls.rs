//! TLS: `rediss://` against a real `redis-server --tls-port` with a throw-away CA and server
//! certificate made by the `openssl` command for each run; a wrong CA is a clear certificate
//! error, and a TLS URL without a TLS feature compiled in is refused at build time.

mod common;
#[path = "common/logs.rs"]
#[allow(dead_code)]
mod logs;

use std::path::PathBuf;
use std::process::Command;

use common::{bounded, free_port, RedisServer};
use fredlock::{Error, LockClient};

/// A directory of PEM files: `ca.pem`, `server.pem`, `server.key`, and `other-ca.pem`, a CA
/// that signed nothing here.
struct Certificates {
    dir: PathBuf,
}

impl Certificates {
    fn make() -> Certificates {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "fredlock-tls-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let openssl = |args: &[&str]| {
            let status = Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .expect("run openssl (apt-get install openssl)");
            assert!(status.success(), "openssl {args:?} failed");
        };
        for ca in ["ca", "other-ca"] {
            openssl(&[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                &format!("/CN=fredlock test {ca}"),
                "-keyout",
                &format!("{ca}.key"),
                "-out",
                &format!("{ca}.pem"),
            ]);
        }
        std::fs::write(
            dir.join("san.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .unwrap();
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ]);
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "san.ext",
            "-out",
            "server.pem",
        ]);
        Certificates { dir }
    }

    fn path(&self, file: &str) -> String {
        self.dir.join(file).display().to_string()
    }
}

impl Drop for Certificates {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A server with a plaintext port (the harness's) and a TLS port, and the TLS port's number.
fn tls_server(certs: &Certificates) -> (RedisServer, u16) {
    tls_server_with(certs, &[])
}

/// [`tls_server`] with `extra` arguments (a user, say).
fn tls_server_with(certs: &Certificates, extra: &[&str]) -> (RedisServer, u16) {
    let tls_port = free_port().to_string();
    let (cert, key, ca) = (
        certs.path("server.pem"),
        certs.path("server.key"),
        certs.path("ca.pem"),
    );
    let mut args = vec![
        "--tls-port",
        &tls_port,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &ca,
        "--tls-auth-clients",
        "no",
    ];
    args.extend_from_slice(extra);
    let server = RedisServer::start_with(&args, free_port);
    (server, tls_port.parse().unwrap())
}

#[cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]
fn rediss(
    port: u16,
    connector: fredlock::fred::types::config::TlsConnector,
) -> fredlock::fred::prelude::Config {
    let mut config =
        fredlock::fred::prelude::Config::from_url(&format!("rediss://127.0.0.1:{port}")).unwrap();
    config.tls = Some(connector.into());
    config
}

#[cfg(feature = "tls-rustls")]
fn rustls_trusting(ca: &std::path::Path) -> fredlock::fred::types::config::TlsConnector {
    use fredlock::fred::rustls;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(ca).unwrap())
        .unwrap();
    // The provider is named: other crates in the tree may compile a second one.
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth()
        .into()
}

#[cfg(feature = "tls-native-tls")]
fn native_tls_trusting(ca: &std::path::Path) -> fredlock::fred::types::config::TlsConnector {
    use fredlock::fred::native_tls;
    let ca = native_tls::Certificate::from_pem(&std::fs::read(ca).unwrap()).unwrap();
    native_tls::TlsConnector::builder()
        .add_root_certificate(ca)
        .disable_built_in_roots(true)
        .build()
        .unwrap()
        .into()
}

/// With a connector trusting the test CA, locks over the TLS port work (the hold shows on the
/// server's plaintext port); with one trusting another CA, connecting fails with a certificate
/// error naming the server.
#[cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]
async fn right_ca_connects_wrong_ca_is_refused(
    trusting: fn(&std::path::Path) -> fredlock::fred::types::config::TlsConnector,
) {
    use fredlock::fred::interfaces::{ClientLike, HashesInterface};
    let certs = Certificates::make();
    let (server, port) = tls_server(&certs);
    let config = rediss(port, trusting(&certs.dir.join("ca.pem")));
    let client = LockClient::builder().config(config).build().await.unwrap();
    let lock = client.lock("tls-lock");
    let guard = lock.lock().await.unwrap();
    assert!(lock.is_locked().await.unwrap());
    let raw = server.raw().await;
    let count: u32 = raw.hget("tls-lock", guard.owner_field()).await.unwrap();
    assert_eq!(count, 1, "the hold is on the server behind the TLS port");
    guard.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
    client.shutdown().await;

    // The service's own client, TLS set up once: handed over, its settings serve the locks
    // (over the TLS port), and the service's client is left working.
    let service = fredlock::fred::types::Builder::from_config(rediss(
        port,
        trusting(&certs.dir.join("ca.pem")),
    ))
    .build()
    .unwrap();
    service.init().await.unwrap();
    let client = LockClient::builder()
        .fred_client(&service)
        .build()
        .await
        .unwrap();
    let guard = client.lock("tls-handed-over").lock().await.unwrap();
    let count: u32 = raw
        .hget("tls-handed-over", guard.owner_field())
        .await
        .unwrap();
    assert_eq!(count, 1, "the hold is on the server behind the TLS port");
    guard.unlock().await.unwrap();
    client.shutdown().await;
    let still: u32 = service.hlen("tls-handed-over").await.unwrap();
    assert_eq!(
        still, 0,
        "the service's own client still works, and the hold is gone"
    );
    service.quit().await.unwrap();

    let wrong = rediss(port, trusting(&certs.dir.join("other-ca.pem")));
    let error = LockClient::builder()
        .config(wrong)
        .build()
        .await
        .unwrap_err();
    let message = error.to_string();
    println!("{message}");
    assert!(matches!(error, Error::Redis { .. }), "{error:?}");
    assert!(message.contains("certificate"), "{message}");
    assert!(message.contains(&format!("127.0.0.1:{port}")), "{message}");
}

/// A service's own redis-rs client set up for TLS with the test CA, handed over: the locks run
/// on redis-rs over the TLS port (the hold shows on the server).
#[cfg(all(feature = "tls-rustls", feature = "redis-rs"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_rs_client_with_tls_is_handed_over() {
    use fredlock::fred::interfaces::HashesInterface;
    bounded(async {
        let certs = Certificates::make();
        let (server, port) = tls_server(&certs);
        let service = redis::Client::build_with_tls(
            format!("rediss://127.0.0.1:{port}"),
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(std::fs::read(certs.dir.join("ca.pem")).unwrap()),
            },
        )
        .unwrap();
        let client = LockClient::builder()
            .redis_rs_client(&service)
            .build()
            .await
            .unwrap();
        assert!(client.redis().is_none(), "on redis-rs");
        let guard = client.lock("tls-redis-rs").lock().await.unwrap();
        let raw = server.raw().await;
        let count: u32 = raw.hget("tls-redis-rs", guard.owner_field()).await.unwrap();
        assert_eq!(count, 1, "the hold is on the server behind the TLS port");
        guard.unlock().await.unwrap();
        client.shutdown().await;
    })
    .await
}

/// A `rediss://` URL on redis-rs speaks TLS and checks the certificate: against the TLS port,
/// with the roots redis-rs trusts (the platform's, or webpki's when another crate turns that
/// on), the test CA's certificate is refused by name (a certificate error, not a protocol
/// error, which a plaintext connection to a TLS port gives). A CA of one's own goes through a
/// handed-over `redis::Client` (`a_redis_rs_client_with_tls_is_handed_over`).
#[cfg(all(feature = "tls-rustls", feature = "redis-rs"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rediss_url_on_redis_rs_checks_the_certificate() {
    bounded(async {
        let certs = Certificates::make();
        let (_server, port) = tls_server(&certs);
        let on_redis_rs = |url: String| {
            LockClient::builder()
                .backend(fredlock::Backend::RedisRs)
                .url(url)
                .command_timeout(std::time::Duration::from_secs(2))
                .build()
        };
        let error = on_redis_rs(format!("rediss://127.0.0.1:{port}"))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("UnknownIssuer") && error.contains(&format!("127.0.0.1:{port}")),
            "{error}"
        );
        let plaintext = tokio::time::timeout(
            std::time::Duration::from_secs(20),
            on_redis_rs(format!("redis://127.0.0.1:{port}")),
        )
        .await
        .expect("a plaintext client on a TLS port gives up")
        .unwrap_err()
        .to_string();
        assert!(!plaintext.contains("UnknownIssuer"), "{plaintext}");
    })
    .await
}

#[cfg(feature = "tls-rustls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rustls_connects_with_the_right_ca_and_refuses_a_wrong_one() {
    bounded(right_ca_connects_wrong_ca_is_refused(rustls_trusting)).await;
}

#[cfg(feature = "tls-native-tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_tls_connects_with_the_right_ca_and_refuses_a_wrong_one() {
    bounded(right_ca_connects_wrong_ca_is_refused(native_tls_trusting)).await;
}

/// A `rediss://` URL with the platform's roots (which do not trust the test CA) fails with a
/// certificate error too; a plaintext URL on the TLS port fails, naming the server and TLS.
#[cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_roots_and_plaintext_on_a_tls_port_are_clear_errors() {
    bounded(async {
        let certs = Certificates::make();
        let (_server, port) = tls_server(&certs);
        let error = LockClient::connect(&format!("rediss://127.0.0.1:{port}"))
            .await
            .unwrap_err()
            .to_string();
        println!("{error}");
        assert!(error.contains("certificate"), "{error}");

        let plaintext = LockClient::builder()
            .url(format!("redis://127.0.0.1:{port}"))
            .command_timeout(std::time::Duration::from_secs(2))
            .build();
        let error = tokio::time::timeout(std::time::Duration::from_secs(20), plaintext)
            .await
            .expect("a plaintext client on a TLS port gives up")
            .unwrap_err()
            .to_string();
        println!("{error}");
        assert!(error.contains(&format!("127.0.0.1:{port}")), "{error}");
    })
    .await;
}

/// Without a TLS feature, a TLS URL is a configuration error before anything connects (fred
/// alone would silently connect in plaintext).
#[cfg(not(any(feature = "tls-rustls", feature = "tls-native-tls")))]
#[tokio::test]
async fn tls_urls_are_refused_without_a_tls_feature() {
    bounded(async {
        let certs = Certificates::make();
        let (_server, port) = tls_server(&certs);
        for url in [
            format!("rediss://127.0.0.1:{port}"),
            format!("rediss-cluster://127.0.0.1:{port}"),
        ] {
            let error = LockClient::connect(&url).await.unwrap_err();
            assert!(matches!(error, Error::InvalidArgument(_)), "{error:?}");
            assert!(error.to_string().contains("tls-rustls"), "{error}");
        }
    })
    .await;
}

/// A `rediss://` URL with a user and a password in it logs in over TLS (the test CA trusted as
/// the platform's roots, through `SSL_CERT_FILE`, in a child process so that no other test sees
/// it), and neither the password nor a wrong one shows in a `Debug`, an error, a log line at
/// TRACE level or a metric's labels (`rediss_url_child` greps them).
#[cfg(all(
    any(feature = "tls-rustls", feature = "tls-native-tls"),
    feature = "metrics"
))]
#[test]
fn a_rediss_url_with_a_user_and_password_logs_in_and_never_shows_them() {
    let certs = Certificates::make();
    let secret = "tls-s3cret-9d";
    let password = format!(">{secret}");
    let user = ["--user", "carol", "on", &password, "~*", "&*", "+@all"];
    let (server, tls_port) = tls_server_with(&certs, &user);
    let env = [
        ("SSL_CERT_FILE", certs.path("ca.pem")),
        (
            "FREDLOCK_TLS_URL",
            format!("rediss://carol:{secret}@localhost:{tls_port}"),
        ),
        ("FREDLOCK_TLS_SECRET", secret.to_string()),
    ];
    let output = common::test_child("rediss_url_child", &env)
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("run the child");
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the child failed: {}\n{printed}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(printed.contains("logged in over TLS"), "{printed}");
    drop(server);
}

/// The child of `a_rediss_url_with_a_user_and_password_logs_in_and_never_shows_them`.
#[cfg(all(
    any(feature = "tls-rustls", feature = "tls-native-tls"),
    feature = "metrics"
))]
#[test]
#[ignore = "run by a_rediss_url_with_a_user_and_password_logs_in_and_never_shows_them"]
fn rediss_url_child() {
    let (Ok(url), Ok(secret)) = (
        std::env::var("FREDLOCK_TLS_URL"),
        std::env::var("FREDLOCK_TLS_SECRET"),
    ) else {
        return;
    };
    let wrong = "wr0ng-tls-pass-9d";
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().expect("the child's one recorder");
    let (logged, _default) = logs::capture_logs(tracing::Level::TRACE);
    // One thread: every task of the clients logs through the default set here.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut shown = Vec::new();
    runtime.block_on(bounded(async {
        let builder = common::builder().url(url.clone()).metrics_lock_names(true);
        shown.push(format!("{builder:?}"));
        let client = builder.build().await.expect("carol logs in over TLS");
        shown.push(format!("{client:?}"));
        let guard = client.lock("tls-secret").lock().await.unwrap();
        shown.push(format!("{guard:?}"));
        guard.unlock().await.unwrap();
        println!("logged in over TLS");
        let refused = common::builder()
            .url(url.replace(&secret, wrong))
            .build()
            .await
            .expect_err("a wrong password is refused");
        shown.push(refused.to_string());
        shown.push(format!("{refused:?}"));
        client.shutdown().await;
    }));
    shown.push(logged.text());
    let metrics = snapshotter.snapshot().into_vec();
    assert!(!metrics.is_empty(), "the lock was counted");
    for (key, _, _, _) in metrics {
        shown.push(format!("{key:?}"));
    }
    for text in &shown {
        assert!(
            !text.contains(&secret) && !text.contains(wrong),
            "a password shown: {text}"
        );
    }
    assert!(shown[0].contains("carol:***@"), "{}", shown[0]);
}
