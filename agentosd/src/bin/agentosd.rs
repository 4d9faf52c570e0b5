fn main() -> anyhow::Result<()> {
    anyhow::bail!("agentosd: not implemented yet")
}
