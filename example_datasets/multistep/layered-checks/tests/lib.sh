# Shared by every step's test.sh: the mode the config file holds.
config_mode() { sed -n 's/^mode=//p' "$CONFIG" 2>/dev/null; }
