# fleetd: `make run` (the daemon on the embedded dev default) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEV_CONFIG := conf/fleetd.dev.toml
# System packages: building tpm2-pytss, and the real peers the tests drive.
APT_BUILD := libtss2-dev pkg-config gcc
# tpm2-openssl, tpm2-abrmd (+ its TCTI) and D-Bus: fleetd-agent's mTLS with
# the TPM-resident LDevID, behind a resource manager as on a node.
# fdisk (sfdisk): the GPT disk images of fleetd-agent's META tests.
# chromium, chromium-driver: the owner console's browser tests (Selenium);
# libnss3-tools (certutil): the NSS database through which that Chromium
# trusts the dev public CA; fonts-dejavu-core: the same text in screenshots.
# systemd (systemd-analyze) and libseccomp2: the unit checked, and its
# hardening imposed on the daemon (tests/test_hardening.py).
# cryptsetup-bin: LUKS2 volumes on files, formatted and opened with what the
# kms listener seals and unseals (tests/test_kms_talos.py).
APT_TEST := swtpm swtpm-tools tpm2-tools prometheus bind9-dnsutils openssl curl \
	tpm2-openssl tpm2-abrmd libtss2-tcti-tabrmd0 dbus-daemon dbus-bin fdisk \
	chromium chromium-driver libnss3-tools fonts-dejavu-core systemd libseccomp2 \
	cryptsetup-bin
# What `make agent-demo` runs beside fleetd: swtpm and its EK CA tools,
# tpm2-abrmd on a private D-Bus, OpenSSL (the EK digest) and its tpm2
# provider, sfdisk; cryptsetup-bin: `fleetd-sim --disk-encryption`'s LUKS2
# volumes on files.
APT_DEMO := swtpm swtpm-tools openssl tpm2-openssl tpm2-abrmd \
	libtss2-tcti-tabrmd0 dbus-daemon dbus-bin fdisk cryptsetup-bin
STAMP := $(VENV)/.installed

.PHONY: run test demo lint imports types unit rules system-build system-test system-demo devpki clean bench agent-demo dist

# The daemon in the foreground as twistd -n has it (exec: this shell's pid,
# $$, becomes fleetd's); in the background, scripts/next_steps.py waits for
# it to be ready and prints what to try next (a fleetctl line, the console
# link, make demo), then exits.
run: system-build $(STAMP) devpki
	$(BIN)/python scripts/next_steps.py --config $(DEV_CONFIG) --pid $$$$ & \
	exec $(BIN)/twistd -n --pidfile= fleetd --config $(DEV_CONFIG)

devpki: $(STAMP)
	$(BIN)/fleetd-devpki --config $(DEV_CONFIG)

# One node's TPM path (attest, disks, plan, META 0x0b on a disk image)
# against `make run` in another terminal: scripts/agent_demo.py.
agent-demo: system-demo $(STAMP) devpki
	$(BIN)/python scripts/agent_demo.py --config $(DEV_CONFIG)

test: system-test $(STAMP) lint imports types rules unit

# A rack of 8 virtual nodes enrolled end to end (fleetd-sim, docs/design.md,
# "The rack simulator's faults") on its own fleetd and tink-server stand-in
# in a temporary directory, stopped at the end: progress on stderr, then the table.
DEMO_NODES ?= 8
demo: system-demo $(STAMP)
	$(BIN)/fleetd-sim --nodes $(DEMO_NODES)

system-build:
	@./.ci/apt-ensure $(APT_BUILD)

system-test:
	@./.ci/apt-ensure $(APT_BUILD) $(APT_TEST)

system-demo:
	@./.ci/apt-ensure $(APT_BUILD) $(APT_DEMO)

$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	# src layout: the editable install is one .pth naming src/, where twistd
	# finds twisted/plugins/fleetd_plugin.py
	$(BIN)/python -m pip install --quiet -e '.[test,dev]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The house plan: layers, independence, no HTTP serving below the listeners,
# no import circle (contracts in pyproject.toml, map in docs/architecture.md).
imports: $(STAMP)
	$(BIN)/lint-imports --no-cache

types: $(STAMP)
	$(BIN)/mypy

rules:
	promtool check rules conf/alerts.yml
	promtool test rules tests/rules/*.yml

unit: $(STAMP)
	FLEETD_REQUIRE_PEERS=1 $(BIN)/python -m twisted.trial $(TRIAL_ARGS) tests

# The wheel (and sdist) for a production install (docs/install.md). The wheel
# carries twisted/plugins/fleetd_plugin.py, so `twistd fleetd` finds the
# plugin in a plain (non-editable) install.
dist: $(STAMP)
	rm -rf dist build
	$(BIN)/python -m pip wheel --quiet --no-deps --no-build-isolation -w dist .
	$(BIN)/python -c "from setuptools import build_meta as b; b.build_sdist('dist')"
	@$(BIN)/python -c "import sys, zipfile, glob; \
	  names = zipfile.ZipFile(glob.glob('dist/fleetd-*.whl')[0]).namelist(); \
	  sys.exit(0 if 'twisted/plugins/fleetd_plugin.py' in names else 'dist: the wheel lacks the twistd plugin')"
	@ls dist

bench: $(STAMP)
	@echo "see bench/README.md"

clean:
	rm -rf $(VENV) .dev _trial_temp* build dist *.egg-info
