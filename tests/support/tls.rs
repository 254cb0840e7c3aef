//! TLS test parts: certificates made with `openssl` for each test, and redis-server on a
//! TLS port (Debian's build has TLS), reached with `redis-cli --tls`.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use super::{free_port, need_tool, temp_dir, wait_until};

/// A test's certificates: `ca` signs `server` (localhost, 127.0.0.1) and `client`;
/// `ca2` signs `server2`, the rotation target; `wrongname` (signed by `ca`) names only
/// `elsewhere.example`.
pub struct Certs {
    pub dir: PathBuf,
}

fn openssl(dir: &PathBuf, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Certs {
    pub fn new(tag: &str) -> Certs {
        need_tool("openssl");
        let dir = temp_dir(tag);
        for ca in ["ca", "ca2"] {
            openssl(
                &dir,
                &[
                    "req",
                    "-x509",
                    "-newkey",
                    "ec",
                    "-pkeyopt",
                    "ec_paramgen_curve:prime256v1",
                    "-nodes",
                    "-keyout",
                    &format!("{ca}.key"),
                    "-out",
                    &format!("{ca}.crt"),
                    "-days",
                    "2",
                    "-subj",
                    &format!("/CN=saltshaker test {ca}"),
                    "-addext",
                    "basicConstraints=critical,CA:TRUE",
                    "-addext",
                    "keyUsage=critical,keyCertSign,cRLSign",
                ],
            );
        }
        let leaf = |name: &str, ca: &str, san: &str| {
            std::fs::write(
                dir.join(format!("{name}.ext")),
                format!(
                    "subjectAltName={san}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n"
                ),
            )
            .unwrap();
            openssl(
                &dir,
                &[
                    "req",
                    "-newkey",
                    "ec",
                    "-pkeyopt",
                    "ec_paramgen_curve:prime256v1",
                    "-nodes",
                    "-keyout",
                    &format!("{name}.key"),
                    "-out",
                    &format!("{name}.csr"),
                    "-subj",
                    &format!("/CN={name}"),
                ],
            );
            openssl(
                &dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &format!("{name}.csr"),
                    "-CA",
                    &format!("{ca}.crt"),
                    "-CAkey",
                    &format!("{ca}.key"),
                    "-CAcreateserial",
                    "-days",
                    "2",
                    "-out",
                    &format!("{name}.crt"),
                    "-extfile",
                    &format!("{name}.ext"),
                ],
            );
        };
        leaf("server", "ca", "DNS:localhost,IP:127.0.0.1");
        leaf("client", "ca", "DNS:client.example");
        leaf("server2", "ca2", "DNS:localhost,IP:127.0.0.1");
        leaf("wrongname", "ca", "DNS:elsewhere.example");
        Certs { dir }
    }

    pub fn path(&self, name: &str) -> String {
        self.dir.join(name).to_string_lossy().into_owned()
    }
}

/// `redis-cli --tls` against `port`, trusting `ca`, with the client certificate when
/// `client_cert`. Times out after 10 s.
pub fn cli(certs: &Certs, port: u16, ca: &str, client_cert: bool, args: &[&str]) -> Output {
    need_tool("redis-cli");
    let mut cmd = Command::new("timeout");
    cmd.args(["10", "redis-cli", "--tls", "--cacert", &certs.path(ca)]);
    if client_cert {
        cmd.args([
            "--cert",
            &certs.path("client.crt"),
            "--key",
            &certs.path("client.key"),
        ]);
    }
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run redis-cli")
}

/// What `cli` printed, trimmed; stderr too, so a refusal shows why.
pub fn cli_text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    )
}

/// A redis-server that speaks TLS only (`--port 0 --tls-port P`), requiring a client
/// certificate signed by `ca` (Redis's default `tls-auth-clients yes`).
pub struct TlsRedis {
    pub port: u16,
    child: Child,
    dir: PathBuf,
}

impl TlsRedis {
    pub fn start(certs: &Certs, server: &str, extra: &[&str]) -> TlsRedis {
        TlsRedis::start_on(certs, server, extra, free_port)
    }

    /// `start`, taking ports from `port` (a cluster node needs port + 10000 free).
    pub fn start_on(certs: &Certs, server: &str, extra: &[&str], port: fn() -> u16) -> TlsRedis {
        need_tool("redis-server");
        for _ in 0..5 {
            let port = port();
            let dir = temp_dir("tls-redis");
            let mut child = Command::new("redis-server")
                .args([
                    "--port",
                    "0",
                    "--tls-port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                ])
                .args(["--save", "", "--appendonly", "no"])
                .args(["--dir", &dir.to_string_lossy(), "--logfile", "redis.log"])
                .args(["--tls-cert-file", &certs.path(&format!("{server}.crt"))])
                .args(["--tls-key-file", &certs.path(&format!("{server}.key"))])
                .args(["--tls-ca-cert-file", &certs.path("ca.crt")])
                .args(extra)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn redis-server");
            let up = wait_until(Duration::from_secs(10), || {
                if let Ok(Some(_)) = child.try_wait() {
                    return true;
                }
                // --insecure: some test servers are signed by ca2 or name another host.
                let out = Command::new("timeout")
                    .args(["5", "redis-cli", "--tls", "--insecure"])
                    .args([
                        "--cert",
                        &certs.path("client.crt"),
                        "--key",
                        &certs.path("client.key"),
                    ])
                    .args(["-p", &port.to_string(), "PING"])
                    .output();
                out.is_ok_and(|o| cli_text(&o) == "PONG")
            });
            if up && matches!(child.try_wait(), Ok(None)) {
                return TlsRedis { port, child, dir };
            }
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_dir_all(&dir);
        }
        panic!("a TLS redis-server did not start");
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The certificates go with the tests that made them.
impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
