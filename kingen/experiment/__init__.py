"""What an experiment is made of besides the scheme: the recording chain of a rig."""
