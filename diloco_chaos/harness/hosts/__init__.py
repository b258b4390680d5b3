"""Where learners run and how they are reached: netns hosts, torchrun, host agents, remote hosts, and the proxies on
their links."""
