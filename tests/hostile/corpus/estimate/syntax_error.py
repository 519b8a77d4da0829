def model(:
