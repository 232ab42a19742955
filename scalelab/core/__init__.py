"""What every stage stands on: errors, the units users type, local commands, where state lives."""
