//! The node image of the `docker` runtime, made on this machine with no registry: a Debian root
//! from `debootstrap` with the node packages in it, imported with `docker import` as the base
//! image, then `docker/Dockerfile` on top adding the entry point and the broker. Each image is
//! labelled with a hash of its inputs and made again only when they change; the base (a minute
//! of debootstrap) hangs only on the package list, suite and archive, so a new broker build
//! costs one small layer.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context as _};
use sha2::{Digest, Sha256};

use crate::docker::docker;

/// The Dockerfile, the entry point and the package list, as committed under `docker/`.
pub const DOCKERFILE: &str = include_str!("../../docker/Dockerfile");
/// The node's entry point (sshd, or the command given).
pub const ENTRYPOINT: &str = include_str!("../../docker/entrypoint.sh");
/// The Debian packages of every node.
pub const NODE_PACKAGES: &str = include_str!("../../docker/node-packages.txt");

/// The label holding an image's input hash.
pub const INPUTS_LABEL: &str = "tidemark.inputs";

/// The repository of base images; their tag is their input hash.
pub const BASE_REPOSITORY: &str = "tidemark-node-base";

/// The Debian release of the nodes.
pub const SUITE: &str = "bookworm";

/// What an image is made from.
#[derive(Debug, Clone)]
pub struct ImageInputs {
    /// The image's name, e.g. `tidemark-node`.
    pub name: String,
    /// The Debian archive debootstrap downloads from.
    pub mirror: String,
    /// The broker binary put into the image.
    pub broker: PathBuf,
}

/// What [`build`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Built {
    /// The base image, `tidemark-node-base:<hash>`.
    pub base: String,
    /// Whether the base image was already there.
    pub base_reused: bool,
    /// Whether the image was already there with the same inputs.
    pub reused: bool,
    /// The input hash the image is labelled with.
    pub inputs: String,
}

/// The packages of [`NODE_PACKAGES`], comments and blank lines left out.
pub fn node_packages() -> Vec<&'static str> {
    parse_packages(NODE_PACKAGES)
}

fn parse_packages(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| l.split('#').next())
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect()
}

/// The archive this machine's apt uses for Debian (the first `URIs:` of a deb822 entry for the
/// suite, or a one-line `deb` entry in `sources.list`), or `None` if none names it.
pub fn apt_mirror(sources: &str, one_line: &str) -> Option<String> {
    let mut uris: Option<&str> = None;
    let mut suite_ok = false;
    let mut found = None;
    // deb822: paragraphs separated by blank lines.
    for line in sources.lines().chain(std::iter::once("")) {
        let line = line.trim();
        if line.is_empty() {
            if let (Some(u), true) = (uris, suite_ok) {
                found = found.or(u.split_whitespace().next().map(str::to_string));
            }
            uris = None;
            suite_ok = false;
        } else if let Some(u) = line.strip_prefix("URIs:") {
            uris = Some(u.trim());
        } else if let Some(s) = line.strip_prefix("Suites:") {
            suite_ok = s.split_whitespace().any(|s| s == SUITE);
        }
    }
    if found.is_some() {
        return found;
    }
    one_line.lines().find_map(|l| {
        let mut words = l.split('#').next()?.split_whitespace();
        if words.next()? != "deb" {
            return None;
        }
        let mut uri = words.next()?;
        if uri.starts_with('[') {
            // Options: `deb [signed-by=...] URI suite ...`.
            while !uri.ends_with(']') {
                uri = words.next()?;
            }
            uri = words.next()?;
        }
        (words.next()? == SUITE).then(|| uri.to_string())
    })
}

/// The archive of [`apt_mirror`] read from this machine's apt sources, or Debian's own.
pub fn default_mirror() -> String {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    apt_mirror(
        &read("/etc/apt/sources.list.d/debian.sources"),
        &read("/etc/apt/sources.list"),
    )
    .unwrap_or_else(|| "http://deb.debian.org/debian".to_string())
}

fn hex(digest: impl AsRef<[u8]>) -> String {
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// The base image's input hash: the suite, the archive and the packages.
pub fn base_hash(mirror: &str) -> String {
    let mut h = Sha256::new();
    h.update(format!("debootstrap minbase {SUITE} {mirror}\n"));
    for p in node_packages() {
        h.update(format!("{p}\n"));
    }
    hex(h.finalize())
}

/// The image's input hash: the base's, the Dockerfile, the entry point and the broker's sha256.
pub fn image_hash(base_hash: &str, broker: &Path) -> anyhow::Result<String> {
    let mut f =
        std::fs::File::open(broker).with_context(|| format!("reading {}", broker.display()))?;
    let mut b = Sha256::new();
    std::io::copy(&mut f, &mut b).with_context(|| format!("reading {}", broker.display()))?;
    let mut h = Sha256::new();
    h.update(format!("{base_hash}\n"));
    h.update(DOCKERFILE);
    h.update(ENTRYPOINT);
    h.update(hex(b.finalize()));
    Ok(hex(h.finalize()))
}

/// The input label of image `name`, or `None` when there is no such image.
fn label_of(name: &str) -> Option<String> {
    let format = format!("{{{{index .Config.Labels \"{INPUTS_LABEL}\"}}}}");
    docker(&["image", "inspect", "--format", &format, name]).ok()
}

/// Makes the image unless it exists with the same inputs; `log` gets a line per step.
pub fn build(inputs: &ImageInputs, log: &mut dyn std::io::Write) -> anyhow::Result<Built> {
    let base_hash = base_hash(&inputs.mirror);
    let base = format!("{BASE_REPOSITORY}:{}", &base_hash[..16]);
    let hash = image_hash(&base_hash, &inputs.broker)?;
    if label_of(&inputs.name).as_deref() == Some(hash.as_str()) {
        return Ok(Built {
            base,
            base_reused: true,
            reused: true,
            inputs: hash,
        });
    }
    let base_reused = label_of(&base).as_deref() == Some(base_hash.as_str());
    if !base_reused {
        let _ = writeln!(
            log,
            "making {base}: debootstrap {SUITE} from {} (about a minute)",
            inputs.mirror
        );
        make_base(&base, &base_hash, &inputs.mirror)?;
        remove_other_bases(&base);
    }
    let _ = writeln!(log, "making {} on {base}", inputs.name);
    let context = tempfile_dir("tidemark-image")?;
    let made = (|| {
        std::fs::write(context.join("Dockerfile"), DOCKERFILE)?;
        std::fs::write(context.join("entrypoint.sh"), ENTRYPOINT)?;
        std::fs::set_permissions(
            context.join("entrypoint.sh"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )?;
        // A hard link costs nothing; another file system needs a copy.
        let broker = context.join("tidemark-broker");
        if std::fs::hard_link(&inputs.broker, &broker).is_err() {
            std::fs::copy(&inputs.broker, &broker)?;
        }
        anyhow::Ok(())
    })()
    .context("preparing the build context");
    let built = made.and_then(|()| {
        let args: Vec<std::ffi::OsString> = vec![
            "build".into(),
            "--quiet".into(),
            "--build-arg".into(),
            format!("BASE={base}").into(),
            "--label".into(),
            format!("{INPUTS_LABEL}={hash}").into(),
            "--tag".into(),
            inputs.name.clone().into(),
            context.clone().into(),
        ];
        docker(&args)
    });
    let _ = std::fs::remove_dir_all(&context);
    built?;
    // The image this one replaced is left without a name: remove it, and only it.
    docker(&[
        "image",
        "prune",
        "--force",
        "--filter",
        &format!("label={INPUTS_LABEL}"),
    ])?;
    Ok(Built {
        base,
        base_reused,
        reused: false,
        inputs: hash,
    })
}

/// Removes the base images made from other inputs (a changed package list or archive); one a
/// container or image still uses stays.
fn remove_other_bases(keep: &str) {
    let Ok(listing) = docker(&[
        "image",
        "ls",
        BASE_REPOSITORY,
        "--format",
        "{{.Repository}}:{{.Tag}}",
    ]) else {
        return;
    };
    for old in listing.lines().filter(|l| *l != keep) {
        let _ = docker(&["image", "rm", old]);
    }
}

fn tempfile_dir(prefix: &str) -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "{prefix}-{}-{}",
        std::process::id(),
        crate::leftovers::new_run_id()
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// debootstrap into a temporary directory, then `tar | docker import` it as `base`.
fn make_base(base: &str, hash: &str, mirror: &str) -> anyhow::Result<()> {
    if !crate::leftovers::is_root() {
        bail!("debootstrap needs root: run `tidemark image build` as root");
    }
    let root = tempfile_dir("tidemark-debootstrap")?;
    let made = debootstrap_and_import(&root, base, hash, mirror);
    let removed =
        std::fs::remove_dir_all(&root).with_context(|| format!("removing {}", root.display()));
    made.and(removed)
}

fn debootstrap_and_import(root: &Path, base: &str, hash: &str, mirror: &str) -> anyhow::Result<()> {
    let include = format!("--include={}", node_packages().join(","));
    let out = Command::new("debootstrap")
        .args(["--variant=minbase", &include, SUITE])
        .arg(root)
        .arg(mirror)
        .stdin(Stdio::null())
        .output()
        .context("running debootstrap (Debian package debootstrap)")?;
    if !out.status.success() {
        let log =
            std::fs::read_to_string(root.join("debootstrap/debootstrap.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(15).collect();
        bail!(
            "debootstrap {SUITE} from {mirror} failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr).trim(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    // The package cache is of no use in the image.
    let _ = std::fs::remove_dir_all(root.join("var/cache/apt/archives"));
    let mut tar = Command::new("tar")
        .arg("-C")
        .arg(root)
        .args(["--numeric-owner", "-c", "."])
        .stdout(Stdio::piped())
        .spawn()
        .context("running tar")?;
    let stdout = tar.stdout.take().expect("piped");
    let import = Command::new("docker")
        .args([
            "import",
            "--change",
            &format!("LABEL {INPUTS_LABEL}={hash}"),
            "-",
            base,
        ])
        .stdin(stdout)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .context("running docker import")?;
    let tar_status = tar.wait().context("waiting for tar")?;
    if !import.status.success() {
        bail!(
            "docker import {base} failed: {}",
            String::from_utf8_lossy(&import.stderr).trim()
        );
    }
    if !tar_status.success() {
        bail!("tar of {} failed: {tar_status}", root.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_package_list_drops_comments() {
        let packages = node_packages();
        assert!(packages.contains(&"openssh-server"));
        assert!(packages.contains(&"faketime"));
        assert!(packages
            .iter()
            .all(|p| !p.contains(' ') && !p.contains('#')));
        assert_eq!(parse_packages("# c\n\na  # why\n b\n"), vec!["a", "b"]);
    }

    #[test]
    fn the_archive_is_read_from_apt_sources() {
        let deb822 =
            "Types: deb\n# http://snapshot.debian.org/x\nURIs: http://mirror.example/debian\n\
                      Suites: bookworm bookworm-updates\nComponents: main\n\n\
                      Types: deb\nURIs: http://deb.debian.org/debian-security\n\
                      Suites: bookworm-security\n";
        assert_eq!(
            apt_mirror(deb822, "").as_deref(),
            Some("http://mirror.example/debian")
        );
        let security_only = "Types: deb\nURIs: http://s/\nSuites: bookworm-security\n";
        assert_eq!(apt_mirror(security_only, ""), None);
        let list = "# comment\ndeb-src http://a/debian bookworm main\n\
                    deb [signed-by=/k.gpg] http://b/debian bookworm main\n";
        assert_eq!(apt_mirror("", list).as_deref(), Some("http://b/debian"));
        assert_eq!(apt_mirror("", "deb http://c/debian trixie main\n"), None);
    }

    #[test]
    fn the_image_hash_follows_the_broker_and_the_base() {
        let dir = tempfile::tempdir().unwrap();
        let broker = dir.path().join("broker");
        std::fs::write(&broker, "one").unwrap();
        let a = image_hash("base1", &broker).unwrap();
        assert_eq!(a, image_hash("base1", &broker).unwrap());
        assert_ne!(a, image_hash("base2", &broker).unwrap());
        std::fs::write(&broker, "two").unwrap();
        assert_ne!(a, image_hash("base1", &broker).unwrap());
        assert_ne!(base_hash("http://a/"), base_hash("http://b/"));
        let err = image_hash("b", Path::new("/nonexistent/broker")).unwrap_err();
        assert!(format!("{err:#}").contains("/nonexistent/broker"));
    }
}
