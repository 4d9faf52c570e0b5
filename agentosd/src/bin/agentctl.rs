fn main() -> anyhow::Result<()> {
    anyhow::bail!("agentctl: not implemented yet")
}
