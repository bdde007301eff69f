//! A real PostgreSQL server for tests: an ephemeral cluster made with
//! `initdb` in a temporary folder, on a free loopback port, shared by every
//! test of one test binary and gone when that binary exits.
//!
//! The server refuses to run as root, so under root it runs as the
//! unprivileged user `postgres` (created if missing); otherwise as the
//! current user. Each board gets a database of its own.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use kanban_board_postgres::PgBoard;

use crate::VirtualClock;

/// The user the server runs as when the tests run as root.
const SERVER_USER: &str = "postgres";
/// The role the tests connect as (trust authentication, loopback only).
pub const PG_ROLE: &str = "kanban";

/// One running cluster.
#[derive(Debug)]
pub struct PgCluster {
    port: u16,
    folder: PathBuf,
    databases: AtomicU64,
    /// The server and its watchdog: the watchdog stops the server and
    /// removes the folder once this process is gone (statics are never
    /// dropped); dropping a cluster stops it at once.
    server: std::process::Child,
    launch: Launch,
    _watchdog: std::process::Child,
}

/// How the server is started, again after a restart.
#[derive(Debug)]
struct Launch {
    identity: Option<(u32, u32)>,
    netns: Option<String>,
    listen: String,
    data: PathBuf,
    folder: PathBuf,
    port: u16,
}

impl Launch {
    fn spawn(&self) -> std::process::Child {
        let mut launch = match (&self.netns, self.identity) {
            (None, identity) => {
                let mut command = Command::new("postgres");
                as_server(&mut command, identity);
                command
            }
            // `ip netns exec` needs root; setpriv then drops to the server's
            // user, exec after exec, so the pid is the server's.
            (Some(netns), Some((uid, gid))) => {
                let mut command = Command::new("ip");
                command
                    .args(["netns", "exec", netns, "setpriv"])
                    .arg(format!("--reuid={uid}"))
                    .arg(format!("--regid={gid}"))
                    .args(["--clear-groups", "postgres"]);
                command
            }
            (Some(netns), None) => panic!("a cluster in network namespace {netns} needs root"),
        };
        launch
            .arg("-D")
            .arg(&self.data)
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-k")
            .arg(&self.folder)
            // Tests never need durability; they need speed and room.
            .arg("-c")
            .arg(format!("listen_addresses={}", self.listen))
            .args(["-c", "fsync=off"])
            .args(["-c", "synchronous_commit=off", "-c", "full_page_writes=off"])
            .args(["-c", "max_connections=400", "-c", "shared_buffers=64MB"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.folder.join("server.log"))
                    .map(Stdio::from)
                    .unwrap_or_else(|_| Stdio::null()),
            )
            .spawn()
            .expect("postgres starts")
    }
}

/// Where and how a cluster runs.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// The network namespace the server runs in (root only); none: this
    /// process's own.
    pub netns: Option<String>,
    /// The addresses it listens on (`listen_addresses`).
    pub listen: String,
    /// A network whose clients it trusts, beside loopback (`10.0.0.0/8`).
    pub trusted_network: Option<String>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            netns: None,
            listen: "127.0.0.1".to_owned(),
            trusted_network: None,
        }
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.folder);
    }
}

fn run(command: &mut Command, what: &str) {
    let output = command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|error| panic!("{what}: cannot start: {error}"));
    assert!(
        output.status.success(),
        "{what} failed ({}): {}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The uid and gid the server runs as: `postgres` under root (created if
/// missing), else the current user (no change).
fn server_identity() -> Option<(u32, u32)> {
    if !nix::unistd::Uid::effective().is_root() {
        return None;
    }
    let lookup = || nix::unistd::User::from_name(SERVER_USER).ok().flatten();
    if lookup().is_none() {
        run(
            Command::new("useradd").args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                SERVER_USER,
            ]),
            "useradd postgres",
        );
    }
    let user = lookup().expect("the postgres user exists after useradd");
    Some((user.uid.as_raw(), user.gid.as_raw()))
}

fn as_server(command: &mut Command, identity: Option<(u32, u32)>) -> &mut Command {
    use std::os::unix::process::CommandExt;
    if let Some((uid, gid)) = identity {
        command.uid(uid).gid(gid);
    }
    command
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free loopback port")
}

impl PgCluster {
    /// The cluster of this test binary, started at the first call.
    pub fn shared() -> &'static PgCluster {
        static CLUSTER: OnceLock<PgCluster> = OnceLock::new();
        CLUSTER.get_or_init(|| PgCluster::start(&ClusterOptions::default()))
    }

    /// A cluster of its own, stopped when dropped.
    pub fn start(options: &ClusterOptions) -> PgCluster {
        let identity = server_identity();
        let folder = std::env::temp_dir().join(format!(
            "kanban-pg-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |elapsed| elapsed.as_nanos())
        ));
        std::fs::create_dir_all(&folder).expect("a folder for the cluster");
        if let Some((uid, gid)) = identity {
            std::os::unix::fs::chown(&folder, Some(uid), Some(gid)).expect("chown the folder");
        }
        let data = folder.join("data");
        run(
            as_server(&mut Command::new("initdb"), identity)
                .arg("-D")
                .arg(&data)
                .args(["-U", PG_ROLE, "-A", "trust", "-E", "UTF8", "--locale=C"])
                .args(["--no-sync", "--no-instructions"])
                .env("HOME", &folder),
            "initdb",
        );
        if let Some(network) = &options.trusted_network {
            use std::io::Write;
            let mut hba = std::fs::OpenOptions::new()
                .append(true)
                .open(data.join("pg_hba.conf"))
                .expect("pg_hba.conf");
            writeln!(hba, "host all all {network} trust").expect("write pg_hba.conf");
        }
        let port = free_port();
        let launch = Launch {
            identity,
            netns: options.netns.clone(),
            listen: options.listen.clone(),
            data: data.clone(),
            folder: folder.clone(),
            port,
        };
        let server = launch.spawn();
        // The server outlives this process unless something stops it: a
        // watchdog stops it and removes the folder once this process is gone.
        let watchdog = format!(
            "while kill -0 {parent} 2>/dev/null && [ -d '{folder}' ]; do sleep 0.2; done; \
             [ -d '{folder}' ] || exit 0; server=$(head -n 1 '{pidfile}' 2>/dev/null) || exit 0; \
             kill -INT \"$server\" 2>/dev/null; \
             for i in 1 2 3 4 5 6 7 8 9 10; do kill -0 \"$server\" 2>/dev/null || break; sleep 0.5; done; \
             kill -KILL \"$server\" 2>/dev/null; rm -rf '{folder}'",
            parent = std::process::id(),
            // The running server, whichever: a restart writes its own pid.
            pidfile = data.join("postmaster.pid").display(),
            folder = folder.display(),
        );
        let watchdog = Command::new("sh")
            .args(["-c", &watchdog])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the cluster's watchdog starts");
        let cluster = PgCluster {
            port,
            folder,
            databases: AtomicU64::new(0),
            server,
            launch,
            _watchdog: watchdog,
        };
        cluster.wait_ready();
        cluster
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let Err(error) = self.try_admin("SELECT 1") else {
                return;
            };
            assert!(
                Instant::now() < deadline,
                "the test cluster did not accept connections within 30 s ({error:?}); see {}",
                self.folder.join("server.log").display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the server (a fast shutdown: every client disconnected).
    fn stop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.server.id()).unwrap_or(0));
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
        let _ = self.server.wait();
    }

    /// Stops the server, waits `down`, and starts it again on the same
    /// port and data: every client loses its connections meanwhile.
    pub fn restart(&mut self, down: Duration) {
        self.stop();
        std::thread::sleep(down);
        self.server = self.launch.spawn();
        self.wait_ready();
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The cluster's folder (its data, socket and log).
    pub fn folder(&self) -> &Path {
        &self.folder
    }

    /// The URL of database `name` on this cluster.
    pub fn url(&self, name: &str) -> String {
        format!("postgres://{PG_ROLE}@127.0.0.1:{}/{name}", self.port)
    }

    /// Settings that reach database `name` through the server's socket in
    /// its folder: from any network namespace.
    pub fn socket_config(&self, name: &str) -> tokio_postgres::Config {
        let mut config = tokio_postgres::Config::new();
        config
            .host_path(&self.folder)
            .port(self.port)
            .user(PG_ROLE)
            .dbname(name);
        config
    }

    /// A new, empty database; returns its name.
    pub fn fresh_database_name(&self) -> String {
        let name = format!(
            "board_{}",
            self.databases.fetch_add(1, Ordering::Relaxed) + 1
        );
        self.admin(&format!("CREATE DATABASE {name}"));
        name
    }

    /// A new, empty database; returns its URL.
    pub fn fresh_database(&self) -> String {
        let name = self.fresh_database_name();
        self.url(&name)
    }

    /// Runs statements on the `postgres` database; panics on failure.
    pub fn admin(&self, sql: &str) {
        if let Err(error) = self.try_admin(sql) {
            panic!("{sql}: {error}");
        }
    }

    /// Runs statements on the database at `url` (of this cluster).
    pub fn admin_on(&self, url: &str, sql: &str) {
        let name = url.rsplit('/').next().unwrap_or("postgres");
        if let Err(error) = self.sql(self.socket_config(name), sql) {
            panic!("{sql}: {error}");
        }
    }

    /// Runs statements on the `postgres` database.
    pub fn try_admin(&self, sql: &str) -> Result<(), tokio_postgres::Error> {
        self.sql(self.socket_config("postgres"), sql)
    }

    fn sql(&self, config: tokio_postgres::Config, sql: &str) -> Result<(), tokio_postgres::Error> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async move {
            let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
            let driver = tokio::spawn(connection);
            let done = client.batch_execute(sql).await;
            drop(client);
            let _ = driver.await;
            done
        })
    }
}

/// A board on its own fresh database of the shared cluster.
#[derive(Debug)]
pub struct TempPgBoard {
    board: PgBoard,
}

impl TempPgBoard {
    /// A fresh board reading time from `clock`.
    pub fn new(clock: VirtualClock) -> Self {
        let url = PgCluster::shared().fresh_database();
        Self::at(&url, clock)
    }

    /// A board at `url` (created or opened), reading time from `clock`.
    pub fn at(url: &str, clock: VirtualClock) -> Self {
        Self {
            board: pg_board_at(url, Arc::new(clock)),
        }
    }
}

/// The board at `url` (created or opened), reading time from `clock`.
pub fn pg_board_at(url: &str, clock: Arc<dyn kanban_core::Clock>) -> PgBoard {
    let config = kanban_board_postgres::parse_url(url).expect("a board URL");
    crate::block_on(PgBoard::connect(config, clock))
        .unwrap_or_else(|error| panic!("{url}: {error}"))
}

impl std::ops::Deref for TempPgBoard {
    type Target = PgBoard;

    fn deref(&self) -> &PgBoard {
        &self.board
    }
}
