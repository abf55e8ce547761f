"""The labels the fake writes on its containers: the real Docker runtime's and its own;
which of them metadata does not show."""

# Labels the real Docker runtime writes (srv/services/constants.py) and the fake's own.
ID_LABEL = "opensandbox.io/id"
EXPIRES_LABEL = "opensandbox.io/expires-at"
MANUAL_LABEL = "opensandbox.io/manual-cleanup"
INSTANCE_LABEL = "opensandbox-fake.instance"
#: On a container whose run label the fake added itself: metadata does not show that label.
ADDED_RUN_LABEL = "opensandbox-fake.run-label-added"
RUN_LABEL = "pytest-harbor.run"
RESERVED_PREFIX = "opensandbox.io/"
#: Label prefixes the real server leaves out of metadata, plus the fake's own.
HIDDEN_PREFIXES = (
    RESERVED_PREFIX,
    "org.opencontainers.image.",
    "com.docker.",
    "desktop.docker.",
    "opensandbox-fake.",
)
