"""Detection: SLIs, multiwindow burn rates, alert rules, routing, grouping and inhibition."""
