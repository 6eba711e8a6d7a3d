#!/bin/sh
echo crawled
