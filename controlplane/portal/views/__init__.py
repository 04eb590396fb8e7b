"""The portal's pages, one module per part: projects and the dashboard, VMs, networks,
storage, people (members, SSH keys, API tokens), billing, the audit log and the operators'
fleet. Each page reads through project-scoped querysets and writes through the services
the API calls; none writes a model itself."""
